"""The stages the evolve-export-time benchmarks share (``llm_layers_bench.py`` over a sample of
``llm_layers.csv``, ``random_shapes_bench.py`` over shapes drawn at random): their common
arguments, the work folder's state, the ``evo run`` child, the export, packing the work folder
for a second device call, and the run of the stages; the time stage is ``_bench_time``.

A benchmark brings its rows (objects with ``shape``, ``m``, ``n``, ``k``, ``key``, ``classes``,
``mclass``, ``weight_bytes`` and ``to_dict()``, as ``_llm_sample.Row``), a ``from_dict`` that
rebuilds a row from ``to_dict()``'s output (the state keeps the rows its work folder was made
for), the function per stage, and its report; :func:`run_main` runs the stages in order.

State (``WORK``): ``state.json`` (the rows, each stage's outcome), ``archive/``, ``lib/`` and
``results.json`` (the time stage's rows, saved after each shape), so that a call cut short
resumes where it stopped.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import _llm_sample as smp
from _llm_report import clean

__all__ = ["STAGES", "SHARED", "shared_files", "UsageError", "OneLineParser", "add_stage_args", "check_stage_args",
           "first_file", "read_json", "write_json", "Run", "run_child", "evolve", "print_archive", "stage_export", "pack",
           "restore", "summarize", "run_main"]

STAGES = ("evolve", "export", "time")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: ../shared beside a checkout, the checkout's own shared/, the carried copy (inside the device's
#: checkout or beside a carry folder there), a worktree's workplace
SHARED = ("../shared", str(ROOT.parent / "shared"), str(ROOT / "shared"), str(ROOT / ".carry_shared"),
          str(ROOT.parent / ".carry_shared"), str(ROOT.parent.parent / "shared"))


def shared_files(rel: str) -> tuple[str, ...]:
    """``rel`` (e.g. ``peers/plain_gemv.py``) in each shared folder, in the order searched."""
    return tuple(f"{d}/{rel}" for d in SHARED)


class UsageError(Exception):
    """Bad arguments: one line, exit 2."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (exit 2), without the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"{self.prog}: {message}", file=sys.stderr)
        sys.exit(2)


def _duration(text: str) -> float:
    from evo.search._config import ConfigError, parse_duration

    try:
        return parse_duration(text, "--budget")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_stage_args(p: argparse.ArgumentParser, *, work: str, budget_s: float, operators: str, anchors: int,
                   wave2_seeds: int = 1) -> None:
    """The arguments every such benchmark takes (its own defaults for the work folder, the
    evolution budget, the operators, the first wave's size and the second wave's picks a template)."""
    p.add_argument("--work", type=Path, default=Path(work), help="archive, library and state")
    p.add_argument("--out", type=Path, help="results (default $OUT, else WORK/out)")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset of evolve,export,time")
    p.add_argument("--budget", type=_duration, default=budget_s,
                   help=f"evolution wall budget in total (default {budget_s / 60:g}m)")
    p.add_argument("--anchors", type=int, default=anchors, help="shapes of the first wave (transfer sources)")
    p.add_argument("--anchor-share", type=float, default=0.35, help="share of the budget for the first wave")
    p.add_argument("--wave2-seeds", type=int, default=wave2_seeds,
                   help=f"seeds per template for the second wave's new shapes (default {wave2_seeds})")
    p.add_argument("--operators", default=operators, help=f"evo run --operators (default {operators})")
    p.add_argument("--arch", default="sm_90a")
    p.add_argument("--peer", type=Path, help="the plain peer (default ../shared/peers/plain_gemv.py, or the carried copy)")
    p.add_argument("--reps", type=int, default=7, help="timed rounds per shape")
    p.add_argument("--time-max-seconds", type=float, default=0.0, help="seconds from this invocation's start (not the time stage's) after which the time stage "
                        "starts no new shape; with the evolve stage in the same call, include its budget (0: no cap)")
    p.add_argument("--retime", action="store_true", help="time shapes again that results.json already has")
    p.add_argument("--retime-class", metavar="CLASS",
                   help="time again the rows of this class only (e.g. decode, with the plain peer beside them)")
    p.add_argument("--pack", type=Path, help="after the stages, write a tar.gz of the work folder's archive, library and state")
    p.add_argument("--restore", type=Path, help="before the stages, unpack such a tar.gz into an empty work folder")
    p.add_argument("--summarize", type=Path, metavar="JSON", help="only rebuild summary.md/json and the plot")
    # Test-only: the module run as `python -m MODULE run ...` instead of evo (tests: fake_evo, evo with
    # the stand-in pool given through the library).
    p.add_argument("--evo-module", default="evo", help=argparse.SUPPRESS)


def check_stage_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Validate what :func:`add_stage_args` added (``p.error`` on bad values); ``--out``'s default."""
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    if not stages or set(stages) - set(STAGES):
        p.error(f"--stages: a comma-separated subset of {','.join(STAGES)}, got {args.stages!r}")
    args.stages = [s for s in STAGES if s in stages]
    if args.anchors < 0 or not 0 < args.anchor_share < 1 or args.reps < 1:
        p.error("--anchors >= 0, --anchor-share in (0, 1), --reps >= 1")
    if args.out is None:
        args.out = Path(os.environ["OUT"]) if os.environ.get("OUT") else args.work / "out"


def first_file(path: Optional[Path], defaults: tuple[str, ...], what: str) -> Path:
    """``path`` if given (it must exist), else the first of ``defaults`` that exists."""
    if path is not None:
        if not path.is_file():
            raise UsageError(f"{what} {path} not found")
        return path
    for d in defaults:
        if Path(d).is_file():
            return Path(d)
    raise UsageError(f"no {what} at {', '.join(defaults)}; give one")


# -- state -----------------------------------------------------------------------------------
def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return default


def write_json(path: Path, data: Any) -> None:
    """Write standard JSON (non-finite floats as null) through a rename, so a cut never halves it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(clean(data), indent=1, allow_nan=False))
    os.replace(tmp, path)


class Run:
    """One invocation: the rows, the work folder's state, logging."""

    def __init__(self, args: argparse.Namespace, sample: list[Any], from_dict: Callable[[dict[str, Any]], Any],
                 tag: Optional[dict[str, Any]] = None) -> None:
        self.args, self.t0 = args, time.monotonic()
        self.work = args.work
        self.archive = self.work / "archive"
        self.lib = self.work / "lib"
        self.state_path = self.work / "state.json"
        self.results_path = self.work / "results.json"
        self.state = read_json(self.state_path, {})
        for key, value in (tag or {}).items():  # what the work folder was made for (the random set's seed)
            if self.state.get(key, value) != value:
                raise UsageError(f"{self.work} was made for {key} {self.state[key]}, not {value}: give another --work")
        self.state.update(tag or {})
        stored = self.state.get("sample")
        if stored and [r["shape"] for r in stored] != [r.shape for r in sample]:
            self.log("note: the work folder holds another sample; keeping its shapes (new work folder to change them)")
            sample = [from_dict(r) for r in stored]
        self.sample = sample
        self.state["sample"] = [r.to_dict() for r in sample]
        self.save()

    def log(self, msg: str) -> None:
        print(f"[{time.monotonic() - self.t0:6.1f}s] {msg}", flush=True)

    def save(self) -> None:
        write_json(self.state_path, self.state)

    def cap(self) -> Optional[float]:
        """The monotonic time after which the time stage starts nothing new (None: no cap)."""
        return self.t0 + self.args.time_max_seconds if self.args.time_max_seconds else None


def run_child(cmd: list[str], timeout_s: float, log: Callable[[str], None]) -> int:
    """Run ``cmd`` (its output goes to ours); past ``timeout_s`` interrupt it (SIGINT to its own
    process group: evo run then finishes in-flight work and commits), then kill that group. When
    this process is stopped meanwhile (SIGTERM, as ``timeout`` sends on the device, or Ctrl-C),
    the child's group is stopped too before we exit, so no ``evo run`` outlives the benchmark."""
    proc = subprocess.Popen(cmd, start_new_session=True, cwd=str(ROOT),
                            env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                                 "PYTHONUNBUFFERED": "1"})
    previous = signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return _stop(proc, 90, log, f"{cmd[3] if len(cmd) > 3 else cmd[0]} ran past {timeout_s:.0f} s: interrupting it")
    except BaseException:
        _stop(proc, 5, log, "stopped: interrupting the child before exiting")
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit_on_term(signum: int, frame: Any) -> None:
    sys.exit(128 + signum)


def _stop(proc: subprocess.Popen, grace_s: float, log: Callable[[str], None], why: str) -> int:
    """SIGINT to ``proc``'s process group, SIGKILL after ``grace_s``; its exit status."""
    log(why)
    os.killpg(proc.pid, signal.SIGINT)
    try:
        return proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


# -- stages ----------------------------------------------------------------------------------
def evolve(run: Run, child: Callable[[list[str], float, Callable[[str], None]], int]) -> bool:
    """``evo run`` over the rows through ``child`` (:func:`run_child`, or a test double), in two
    waves: ``--anchors`` rows spread over the classes (``_llm_sample.waves``) with
    ``--anchor-share`` of ``--budget``, then every row with the rest, the new ones seeded by
    transfer from the anchors' elites. A wave already done is skipped."""
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
        rc = child(cmd, budget + 240, run.log)
        done[name] = {"done": rc == 0, "rc": rc, "budget_s": round(budget, 1), "seconds": round(time.monotonic() - t, 1),
                      "shapes": len(rows)}
        run.save()
        ok = ok and rc == 0
        run.log(f"evolve {name}: exit {rc} after {done[name]['seconds']:.0f} s")
    print_archive(run)
    return ok


def print_archive(run: Run) -> None:
    """Per row: evaluations, the best elite's fitness and roofline fraction in the archive."""
    from evo.search._calibration import evaluation_roofline, load_calibration
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
    """``python -m evo export`` of the archive to ``WORK/lib`` (``--verify auto``: re-timed on a GPU)."""
    if not run.archive.is_dir():
        run.log("export: no archive (run the evolve stage first)")
        return False
    run.log(f"export: {run.archive} -> {run.lib}")
    rc = run_child([sys.executable, "-m", "evo", "export", str(run.archive), "--out", str(run.lib), "--arch",
                    run.args.arch], 600, run.log)
    manifest = read_json(run.lib / "manifest.json", {})
    run.state["export"] = {"done": rc == 0, "rc": rc, "kernels": len(manifest.get("kernels", [])),
                           "skipped": len(manifest.get("skipped", [])), "verify": manifest.get("verify")}
    run.save()
    run.log(f"export: exit {rc}; {run.state['export']['kernels']} kernels, {run.state['export']['skipped']} skipped")
    return rc == 0


# -- packing, the whole run -------------------------------------------------------------------
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


Report = Callable[[dict[str, Any], Path], dict[str, Path]]


def summarize(path: Path, out: Path, report: Report) -> int:
    """``--summarize``: the report again from a results file (no GPU)."""
    if not path.is_file():
        raise UsageError(f"--summarize {path}: no such file")
    try:
        results = json.loads(path.read_text())
    except ValueError as exc:
        raise UsageError(f"--summarize {path}: not JSON ({exc})") from None
    if not isinstance(results, dict) or not isinstance(results.get("rows"), list):
        raise UsageError(f"--summarize {path}: no 'rows' list (a results.json of the time stage?)")
    files = report(results, out)
    print(files["md"].read_text())
    return 0


def run_main(args: argparse.Namespace, sample: list[Any], from_dict: Callable[[dict[str, Any]], Any],
             stages: dict[str, Callable[[Run], bool]], report: Report, tag: Optional[dict[str, Any]] = None) -> int:
    """``--restore``, the stages in order, the report of ``WORK/results.json`` under ``--out``,
    ``--pack``. Exit 0, or 1 when a stage failed. ``tag``: values the work folder must have been
    made for (kept in its state; UsageError when it holds others)."""
    if args.restore is not None and restore(args.restore, args.work):
        print(f"restored {args.restore} into {args.work}", flush=True)
    run = Run(args, sample, from_dict, tag)
    run.log(f"{len(run.sample)} shapes; stages {','.join(args.stages)}; work {args.work}; out {args.out}")
    ok = True
    for stage in args.stages:
        ok = stages[stage](run) and ok
    results = read_json(run.results_path, None)
    if results is not None:
        write_json(args.out / "results.json", results)
        files = report(results, args.out)
        print(files["md"].read_text(), flush=True)
    if args.pack is not None:
        pack(run.work, args.pack)
        run.log(f"packed the work folder into {args.pack} ({args.pack.stat().st_size / 1e6:.1f} MB)")
    run.log("done" if ok else "done, with a failed stage (see above)")
    return 0 if ok else 1
