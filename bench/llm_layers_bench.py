"""Issue 26's benchmark (GPU machine, one command): evolve a sample of llm_layers.csv, export it,
re-time the exported library beside cuBLAS and the plain peer.

    python3 bench/llm_layers_bench.py [--csv CSV] [--work DIR] [--out DIR] [--stages evolve,export,time]
                                      [--budget 20m] [--peer PATH] [options]
    python3 bench/llm_layers_bench.py --list                          # the sample and its classes (no GPU)
    python3 bench/llm_layers_bench.py --summarize results.json --out DIR   # tables and plot again (no GPU)

Sample (``_llm_sample``): at least ``--total`` shapes (48) with at least ``--per-class`` (8) in each
class of issue 26 (decode M <= 16, M 17-128, M 129-1024, M >= 2048, under 1e8 FLOP, misaligned);
a shape counts in every class it is in; the M=8 rows also at M=16, and the misaligned rows at
more token counts where the CSV has too few (marked in ``origin``).

Stages (each can be run alone; state in ``WORK/state.json``, so a cut call resumes):

- ``evolve``: ``evo run`` over the sample through the engine (the ``python -m evo run`` command in
  a child process, so a hang cannot take the benchmark with it), in two waves: ``--anchors``
  shapes spread over the classes first with ``--anchor-share`` of ``--budget``, then every shape
  with the rest, the new ones seeded by transfer from the anchors' elites (plus
  ``--wave2-seeds`` heuristic picks per template). The engine spends its slots by headroom
  against the roofline (issue 26). A wave already done is skipped; an interrupted one is run
  again with its whole budget.
- ``export``: ``python -m evo export`` of the archive to ``WORK/lib`` (the library decides per
  shape whether its kernel or cuBLAS runs; on the GPU machine ``--verify auto`` first re-times the
  top candidates beside cuBLAS with the same timer as the ``time`` stage).
- ``time``: this script's own timer (``_llm_timer``: CUDA-graph replay over rotating operand sets
  > 2x L2, medians, all contenders interleaved in one process): cuBLAS in both layouts
  (``a @ w.t()`` and ``a @ wt``, the better taken), the exported library's ``evo_hgemm`` (and which
  path it took), and on decode rows the plain peer imported from ``--peer`` at run time. Shapes
  timed already in ``WORK/results.json`` are not timed again (``--retime`` does); one that failed
  is tried again; one that lost the CUDA context ends the stage and is skipped the next time (so
  the call after it goes on with the rest). ``--time-max-seconds`` (from the start of this
  invocation) stops starting new shapes.

Writes under ``--out`` (default $OUT, else WORK/out): ``results.json``, ``summary.md`` (per shape:
GPU time, speedup and roofline fraction of cuBLAS, peer and evo, the library's path; per class;
the issue's targets met or missed by how much), ``summary.json``, ``speedup_vs_roofline.png``,
and with ``--pack FILE`` a tarball of the work folder's archive, library and state (``--restore FILE``
puts it back before the stages run, for a second device call). Exit 0; 1 when a stage failed; 2 for
bad arguments.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import _llm_sample as smp  # noqa: E402
from _llm_report import clean, derive, write_report  # noqa: E402

STAGES = ("evolve", "export", "time")
#: ../shared beside a checkout, the checkout's own shared/, the carried copy (inside the device's
#: checkout or beside a carry folder there), a worktree's workplace
_SHARED = ("../shared", str(ROOT.parent / "shared"), str(ROOT / "shared"), str(ROOT / ".carry_shared"),
           str(ROOT.parent / ".carry_shared"), str(ROOT.parent.parent / "shared"))
CSV_DEFAULTS = tuple(f"{d}/shapes/llm_layers.csv" for d in _SHARED)
PEER_DEFAULTS = tuple(f"{d}/peers/plain_gemv.py" for d in _SHARED)


class UsageError(Exception):
    """Bad arguments: one line, exit 2."""


def _duration(text: str) -> float:
    from evo._config import ConfigError, parse_duration

    try:
        return parse_duration(text, "--budget")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="llm_layers_bench.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--csv", type=Path, help="shapes CSV (default ../shared/shapes/llm_layers.csv, or the carried copy)")
    p.add_argument("--work", type=Path, default=Path("/tmp/evo_llm_layers"), help="archive, library and state")
    p.add_argument("--out", type=Path, help="results (default $OUT, else WORK/out)")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of evolve,export,time")
    p.add_argument("--budget", type=_duration, default=1200.0, help="evolution wall budget in total (default 20m)")
    p.add_argument("--anchors", type=int, default=12, help="shapes of the first wave (transfer sources)")
    p.add_argument("--anchor-share", type=float, default=0.35, help="share of the budget for the first wave")
    p.add_argument("--wave2-seeds", type=int, default=1, help="seeds per template for the second wave's new shapes")
    p.add_argument("--operators", default="knob", help="evo run --operators (default knob)")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--total", type=int, default=48, help="shapes in the sample (at least)")
    p.add_argument("--per-class", type=int, default=8, help="shapes per class (at least, where the CSV allows)")
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--peer", type=Path, help="the plain peer (default ../shared/peers/plain_gemv.py, or the carried copy)")
    p.add_argument("--reps", type=int, default=7, help="timed rounds per shape")
    p.add_argument("--time-max-seconds", type=float, default=0.0, help="seconds from this invocation's start (not the time stage's) after which the time stage "
                        "starts no new shape; with the evolve stage in the same call, include its budget (0: no cap)")
    p.add_argument("--retime", action="store_true", help="time shapes again that results.json already has")
    p.add_argument("--pack", type=Path, help="after the stages, write a tar.gz of the work folder's archive, library and state")
    p.add_argument("--restore", type=Path, help="before the stages, unpack such a tar.gz into an empty work folder")
    p.add_argument("--list", action="store_true", help="print the sample, its classes and waves; no GPU")
    p.add_argument("--summarize", type=Path, metavar="JSON", help="only rebuild summary.md/json and the plot")
    # Test-only: the module run as `python -m MODULE run ...` instead of evo (tests: fake_evo, evo with
    # the stand-in pool given through the library).
    p.add_argument("--evo-module", default="evo", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if not stages or set(stages) - set(STAGES):
        p.error(f"--stages: a comma-separated subset of {','.join(STAGES)}, got {args.stages!r}")
    args.stages = [s for s in STAGES if s in stages]
    if args.total < 1 or args.per_class < 0 or args.anchors < 0 or not 0 < args.anchor_share < 1 or args.reps < 1:
        p.error("--total >= 1, --per-class >= 0, --anchors >= 0, --anchor-share in (0, 1), --reps >= 1")
    if args.out is None:
        args.out = Path(os.environ["OUT"]) if os.environ.get("OUT") else args.work / "out"
    return args


def _first(path: Optional[Path], defaults: tuple[str, ...], what: str) -> Path:
    if path is not None:
        if not path.is_file():
            raise UsageError(f"{what} {path} not found")
        return path
    for d in defaults:
        if Path(d).is_file():
            return Path(d)
    raise UsageError(f"no {what} at {', '.join(defaults)}; give one")


def choose_sample(args: argparse.Namespace) -> list[smp.Row]:
    rows = smp.read_rows(_first(args.csv, CSV_DEFAULTS, "shapes CSV"))
    return smp.sample(smp.candidate_pool(rows, args.per_class), args.total, args.per_class, args.seed)


def print_sample(sample: list[smp.Row], anchors: int, seed: int) -> None:
    first, _ = smp.waves(sample, anchors, seed)
    ids = {r.key for r in first}
    for r in sample:
        print(f"{r.shape:>24} {r.model:>14} {r.layer:>8} {r.weight_bytes / 1e6:8.1f} MB  {' '.join(r.classes):<28}"
              f"{'wave 1' if r.key in ids else 'wave 2'}  {r.origin}")
    counts = smp.class_counts(sample)
    print(f"{len(sample)} shapes; per class (a shape counts in each of its classes): "
          + ", ".join(f"{smp.LABELS[c]} {n}" for c, n in counts.items()))


# -- state -----------------------------------------------------------------------------------
def _read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean(data), indent=1, allow_nan=False))
    os.replace(tmp, path)


class Run:
    """One invocation: the sample, the work folder's state, logging."""

    def __init__(self, args: argparse.Namespace, sample: list[smp.Row]) -> None:
        self.args, self.t0 = args, time.monotonic()
        self.work = args.work
        self.archive = self.work / "archive"
        self.lib = self.work / "lib"
        self.state_path = self.work / "state.json"
        self.state = _read_json(self.state_path, {})
        stored = self.state.get("sample")
        if stored and [r["shape"] for r in stored] != [r.shape for r in sample]:
            self.log("note: the work folder holds another sample; keeping its shapes (new work folder to change them)")
            sample = [smp.Row(r["M"], r["N"], r["K"], r["model"], r["layer"], r["origin"]) for r in stored]
        self.sample = sample
        self.state["sample"] = [r.to_dict() for r in sample]
        self.save()

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def save(self) -> None:
        _write_json(self.state_path, self.state)


def run_child(cmd: list[str], timeout_s: float, log: Callable[[str], None]) -> int:
    """Run ``cmd`` (its output goes to ours); past ``timeout_s`` interrupt it (SIGINT to its own
    process group: evo run then finishes in-flight work and commits), then kill that group."""
    proc = subprocess.Popen(cmd, start_new_session=True, cwd=str(ROOT),
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                                 "PYTHONUNBUFFERED": "1"})
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        log(f"{cmd[3] if len(cmd) > 3 else cmd[0]} ran past {timeout_s:.0f} s: interrupting it")
        os.killpg(proc.pid, signal.SIGINT)
        try:
            return proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            return proc.wait()


# -- stages ----------------------------------------------------------------------------------
def stage_evolve(run: Run) -> bool:
    args = run.args
    first, _ = smp.waves(run.sample, args.anchors, args.seed)
    b1 = args.budget * args.anchor_share if first else 0.0
    plan = [("wave1", first, b1, None), ("wave2", run.sample, args.budget - b1, args.wave2_seeds)]
    done = run.state.setdefault("evolve", {})
    ok = True
    for name, rows, budget, seeds in plan:
        if not rows or budget <= 0 or done.get(name, {}).get("done"):
            continue
        config = run.work / "run.toml"  # plain progress every 30 s: 48 shapes a line each every 5 s is a flood
        config.write_text('progress_interval = "30s"\n')
        cmd = [sys.executable, "-m", args.evo_module, "run", "--archive", str(run.archive), "--budget", f"{budget:.0f}s",
               "--operators", args.operators, "--progress", "plain", "--seed", str(args.seed), "--config", str(config)]
        if seeds is not None:
            cmd += ["--seeds-per-template", str(seeds)]
        for r in rows:
            cmd += ["--shape", r.shape]
        run.log(f"evolve {name}: {len(rows)} shapes, {budget:.0f} s of evolution")
        t = time.monotonic()
        rc = run_child(cmd, budget + 240, run.log)
        done[name] = {"done": rc == 0, "rc": rc, "budget_s": round(budget, 1), "seconds": round(time.monotonic() - t, 1),
                      "shapes": len(rows)}
        run.save()
        ok = ok and rc == 0
        run.log(f"evolve {name}: exit {rc} after {done[name]['seconds']:.0f} s")
    _print_archive(run)
    return ok


def _print_archive(run: Run) -> None:
    from evo._calibration import evaluation_roofline, load_calibration
    from populations import Archive, ArchiveError, Shape

    try:
        ar = Archive(run.archive, "r")
    except (ArchiveError, OSError) as exc:
        run.log(f"no archive to show: {exc}")
        return
    cal = load_calibration(run.archive)
    present = set(ar.shapes())
    for r in run.sample:
        s = Shape.parse(r.shape)
        el = ar.elites(s, top=1) if s in present else []
        n = sum(ar.status_counts(s).values()) if s in present else 0
        fit = f"{el[0].fitness:.3f}x" if el and el[0].fitness else "-"
        roof = evaluation_roofline(el[0].latest, cal) if el else None
        print(f"  {r.shape:>24}  {n:4d} evals  best {fit:>7}  roofline {'-' if roof is None else f'{roof:.2f}'}",
              flush=True)


def stage_export(run: Run) -> bool:
    if not run.archive.is_dir():
        run.log("export: no archive (run the evolve stage first)")
        return False
    run.log(f"export: {run.archive} -> {run.lib}")
    rc = run_child([sys.executable, "-m", "evo", "export", str(run.archive), "--out", str(run.lib), "--arch",
                    run.args.arch], 600, run.log)
    manifest = _read_json(run.lib / "manifest.json", {})
    run.state["export"] = {"done": rc == 0, "rc": rc, "kernels": len(manifest.get("kernels", [])),
                           "skipped": len(manifest.get("skipped", [])), "verify": manifest.get("verify")}
    run.save()
    run.log(f"export: exit {rc}; {run.state['export']['kernels']} kernels, {run.state['export']['skipped']} skipped")
    return rc == 0


def manifest_claim(manifest: dict[str, Any], shape: str) -> tuple[Optional[str], str]:
    """What the export's manifest says of ``shape``: (path, reason), from whichever list names it
    (the exporter decides the fields; ``path``/``dispatch``/``route``/``backend`` and
    ``reason``/``why`` are looked for)."""
    for key, items in manifest.items():
        if not isinstance(items, list):
            continue
        for e in items:
            if isinstance(e, dict) and e.get("shape") == shape:
                path = next((str(e[k]) for k in ("path", "dispatch", "route", "backend") if e.get(k)), None)
                why = next((str(e[k]) for k in ("reason", "why") if e.get(k)), "")
                if path is None and key != "kernels":
                    path = f"not exported ({key})"
                return path, why
    return None, "not in the manifest"


def library_path(lib: Any, row: smp.Row, a: Any, w: Any) -> tuple[str, str]:
    """("evolved" or "cuBLAS", why) for what ``lib.evo_hgemm(a, w.t())`` runs at ``row``."""
    if lib is None:
        return "cuBLAS", "no exported library"
    if not getattr(lib, "active", True):
        return "cuBLAS", f"library not loaded: {getattr(lib, 'reason', '?')}"
    claim, why = manifest_claim(getattr(lib, "manifest", {}) or {}, row.shape)
    try:
        routed = lib.route(a, w.t()) if hasattr(lib, "route") else True
    except Exception as exc:
        return "unknown", f"route: {type(exc).__name__}: {exc}"
    if routed is None:
        return "cuBLAS", why or (claim or "not exported")
    if claim and "cublas" in claim.lower():
        return "cuBLAS", why or claim
    entry = (getattr(lib, "kernels", {}) or {}).get((row.m, row.n, row.k, "TN"), {})
    return "evolved", f"{entry.get('template') or 'free-form'} {str(entry.get('candidate', ''))[:12]}".strip()


def import_peer(path: Path) -> Any:
    """The peer module, imported from its file (never copied into the repository)."""
    spec = importlib.util.spec_from_file_location("plain_gemv_peer", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def stage_time(run: Run) -> bool:
    args = run.args
    import torch

    if not torch.cuda.is_available():
        run.log("time: no CUDA device")
        return False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.zeros(1, device="cuda")
    from _llm_timer import REL_TOL, PeerRunner, Sets, rel_error, time_arms

    results_path = run.work / "results.json"
    results = _read_json(results_path, {"meta": {}, "rows": []})
    have = {r["shape"]: r for r in results.get("rows", [])}
    lib = None
    if (run.lib / "manifest.json").is_file():
        from evo._export import load_library

        try:
            lib = load_library(run.lib)
            run.log(f"library {run.lib}: {len(lib.kernels)} kernels" + ("" if lib.active else f", not active: {lib.reason}"))
        except Exception as exc:
            run.log(f"library {run.lib} not usable: {type(exc).__name__}: {exc}")
    decode_ms = sorted({r.m for r in run.sample if r.m <= 16 and r.k % 8 == 0})
    peer, peer_note = None, ""
    try:
        t = time.monotonic()
        peer = PeerRunner(import_peer(_first(args.peer, PEER_DEFAULTS, "peer")), decode_ms) if decode_ms else None
        run.log(f"peer built for M in {decode_ms} in {time.monotonic() - t:.1f} s")
    except Exception as exc:  # no cupy, no file: the peer columns stay empty, with the reason
        peer_note = f"peer unavailable: {type(exc).__name__}: {str(exc)[:160]}"
        run.log(peer_note)
    props = torch.cuda.get_device_properties(0)
    l2 = int(props.L2_cache_size)
    from evo._calibration import load_calibration

    cal = load_calibration(run.archive)
    results["meta"] = {"gpu": f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}",
                       "command": " ".join(sys.argv), "evolve": json.dumps(run.state.get("evolve", {})),
                       "export": json.dumps(run.state.get("export", {})),
                       "calibration": f"{cal.source}: {cal.peak_flops / 1e12:.0f} TFLOP/s, read {cal.read_bw / 1e12:.2f} TB/s, "
                                      f"copy {cal.copy_bw / 1e12:.2f} TB/s, launch {cal.launch_floor_s * 1e6:.2f} us",
                       "timer": f"bench/_llm_timer.py, {args.reps} rounds, rotation > 2x L2 ({l2 >> 20} MB)",
                       **({"peer": peer_note} if peer_note else {})}
    rng = random.Random(args.seed)

    def save() -> None:
        results["rows"] = [have[r.shape] for r in run.sample if r.shape in have]
        _write_json(results_path, results)

    def one(row: smp.Row) -> dict[str, Any]:
        return _time_one(row, lib, peer, l2, args.reps, rng, Sets, rel_error, time_arms, REL_TOL)

    cap = run.t0 + args.time_max_seconds if args.time_max_seconds else None
    ok = time_shapes(smp.interleave(run.sample, args.seed), have, one, save, run.log, cap=cap, retime=args.retime)
    save()
    return ok


def time_shapes(order: list[smp.Row], have: dict[str, dict[str, Any]], one: Callable[[smp.Row], dict[str, Any]],
                save: Callable[[], None], log: Callable[[str], None], *, cap: Optional[float] = None,
                retime: bool = False, clock: Callable[[], float] = time.monotonic) -> bool:
    """Time ``order`` into ``have`` (shape -> row), saving after each: rows timed already are
    skipped (unless ``retime``), failed ones are tried again, a lost CUDA context ends the loop
    and marks its shape ``fatal`` (skipped next time); no new shape starts after ``cap``.
    False when a shape failed."""
    ok = True
    for i, row in enumerate(order):
        done = have.get(row.shape, {})
        if not retime and (done.get("cublas_tn_s") or done.get("fatal")):
            continue
        if cap is not None and clock() > cap:
            log(f"time: cap reached; {len(order) - i} shape(s) not timed")
            break
        try:
            rec = one(row)
        except Exception as exc:  # one shape's failure is recorded; a dead context ends the stage
            rec = {**row.to_dict(), "notes": f"{type(exc).__name__}: {str(exc)[:200]}"}
            ok = False
            if "illegal" in str(exc).lower() or "context" in str(exc).lower():
                have[row.shape] = {**rec, "fatal": True}
                save()
                log(f"time: CUDA context lost at {row.shape}: {exc}")
                break
        have[row.shape] = rec
        save()
        d = derive(rec) if rec.get("cublas_tn_s") else rec
        log(f"{i + 1:>3}/{len(order)} {row.shape:>24} cuBLAS {_us(d.get('cublas_s'))} ({d.get('cublas_layout')}, "
            f"roof {_r(d.get('cublas_roof'))})  evo {_us(d.get('evo_s'))} {_r(d.get('evo_x'))}x {rec.get('evo_path')}"
            f"  peer {_us(d.get('peer_s'))} {_r(d.get('peer_x'))}x" + (f"  {rec['notes']}" if rec.get("notes") else ""))
    return ok


def _us(x: Optional[float]) -> str:
    return "-" if not x else f"{x * 1e6:8.2f} us"


def _r(x: Optional[float]) -> str:
    return "-" if not x else f"{x:.2f}"


def _time_one(row: smp.Row, lib: Any, peer: Any, l2: int, reps: int, rng: random.Random, Sets: Any, rel_error: Any,
              time_arms: Any, tol: float) -> dict[str, Any]:
    import torch

    sets = Sets(row.m, row.n, row.k, l2, seed=rng.randrange(1 << 30))
    ref = sets.reference()
    rec: dict[str, Any] = {**row.to_dict(), "sets": sets.n_sets, "rotation_mb": round(sets.bytes / 1e6, 1)}
    notes = []
    arms = {"cublas_tn": lambda i: torch.matmul(sets.a[i], sets.w[i].t(), out=sets.c[i]),
            "cublas_nn": lambda i: torch.matmul(sets.a[i], sets.wt[i], out=sets.c[i])}
    path, why = library_path(lib, row, sets.a[0], sets.w[0])
    rec.update(evo_path=path, evo_why=why)
    call = lib.evo_hgemm if lib is not None else (lambda a, b: torch.matmul(a, b))
    err = rel_error(call(sets.a[0], sets.w[0].t()), ref)
    rec["evo_rel_err"] = err
    if err < tol:
        arms["evo"] = lambda i: call(sets.a[i], sets.w[i].t())
    else:
        notes.append(f"evo output wrong (relative error {err:.2e}): not timed")
    if peer is not None and row.m <= 16:
        if row.k % 8:
            rec["peer_note"] = "the peer needs K % 8 == 0"
        else:
            launch, cfg, screened = peer.best(sets, ref, row.m, rng)
            rec.update(peer_cfg=cfg, peer_configs=len(screened))
            if launch is not None:
                arms["peer"] = launch
            else:
                rec["peer_note"] = "no peer configuration passed the check"
    times = time_arms(arms, sets.n_sets, rounds=reps, rng=rng)
    for name, t in times.items():
        rec[f"{name}_s"] = t
    rec["notes"] = "; ".join(notes)
    del sets, ref
    torch.cuda.empty_cache()
    return rec


# -- packing ---------------------------------------------------------------------------------
def pack(work: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(dest, "w:gz") as tar:
        for name in ("archive", "lib", "state.json", "results.json"):
            if (work / name).exists():
                tar.add(work / name, arcname=name, filter=lambda ti: None if ti.name.endswith(".lock") else ti)


def restore(src: Path, work: Path) -> bool:
    if (work / "archive").exists():
        return False
    work.mkdir(parents=True, exist_ok=True)
    with tarfile.open(src, "r:gz") as tar:
        tar.extractall(work, filter="data")
    return True


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    try:
        if args.summarize is not None:
            if not args.summarize.is_file():
                raise UsageError(f"--summarize {args.summarize}: no such file")
            files = write_report(json.loads(args.summarize.read_text()), args.out)
            print(files["md"].read_text())
            return 0
        sample = choose_sample(args)
        if args.list:
            print_sample(sample, args.anchors, args.seed)
            return 0
        if args.restore is not None and restore(args.restore, args.work):
            print(f"restored {args.restore} into {args.work}", flush=True)
        run = Run(args, sample)
        run.log(f"{len(run.sample)} shapes; stages {','.join(args.stages)}; work {args.work}; out {args.out}")
        ok = True
        for stage in args.stages:
            ok = {"evolve": stage_evolve, "export": stage_export, "time": stage_time}[stage](run) and ok
        results = _read_json(run.work / "results.json", None)
        if results is not None:
            _write_json(args.out / "results.json", results)
            files = write_report(results, args.out)
            print(files["md"].read_text(), flush=True)
        if args.pack is not None:
            pack(run.work, args.pack)
            run.log(f"packed the work folder into {args.pack} ({args.pack.stat().st_size / 1e6:.1f} MB)")
        run.log("done" if ok else "done, with a failed stage (see above)")
        return 0 if ok else 1
    except UsageError as exc:
        print(f"llm_layers_bench: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
