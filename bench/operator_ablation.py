#!/usr/bin/env python
"""Issue 25's ablation: does the LLM operator earn its GPU time on shapes of models it never saw?

    python bench/operator_ablation.py --split SPLIT.json --out DIR [--shapes 6] [--seeds 0,1,2]
        [--gpu-seconds 60] [--arms knob,knob+optuna,knob+llm,knob+llm_adapter,bandit]
        [--adapter ADAPTER_DIR/v1 [--adapter ADAPTER_DIR/v2 ...]] [--llm-device cuda] [--wall-cap 240] [--seeds-per-template N]
        [--call-s 525 [--first-run-s S]] [--gpus 0,1,...]
    python bench/operator_ablation.py --tiny --out DIR      # CPU smoke test: the stand-in pool
    python bench/operator_ablation.py --report-only --out DIR [--runs RUNS]   # the report again, from runs made

The test shapes of an ``evo rl split`` file (``--layers llm_layers.csv`` makes one, seed 0) are
sampled once (``--shapes`` of them, seeded, spread over the shape classes) and every arm runs
``evo run`` on exactly those shapes, from a fresh archive, once per seed, with the same
``--gpu-seconds`` budget (the LLM's own GPU seconds count in it: evo charges them), so arms are
compared at equal GPU cost. Arms (``ARMS`` below): ``knob`` (knob mutation, crossover, random),
``knob+optuna``, ``knob+ranked`` (the ranking step beside them: issue 35's tabular cost model picks
4 of 64 knob children), ``knob+llm_ranker`` and ``knob+llm_ranker_adapter`` (the same step ranked by
the LLM's log-likelihood of each edit, base model and ``--adapter``), ``knob+llm`` (the base model), ``knob+llm_adapter`` (the model with
``--adapter``, the RL adapter; skipped and reported when none is given; with ``--adapter`` given
for several versions, one arm per version, ``knob+llm_adapter@vN``) and ``bandit`` (knob, Optuna
and the LLM, with the latest adapter when given, under ``--operator-bandit``). The report's version
table compares each adapter's LLM children on the test split with the previous version's (version
0: the base model's ``knob+llm`` arm): the share that improved their parent, and whether it rose. With
``--llm-device cuda`` the model is co-located with the timers (the GPU lease keeps it out of the
timed regions); the default ``cpu`` keeps it off the GPU.

Per run and per arm (mean and range over seeds): evaluations, valid share (ok and unflagged),
improving share (children that beat their parent), flagged share, the LLM's tokens (every call, from
the stop event), proposals, children evaluated and children improving (scripts/operator_shares.py's
counts), the LLM's GPU seconds (held: what evo charges) and the seconds it waited for the GPU lease
(the old charge was their sum),
GPU seconds in all, *improvement per GPU-second* (sum over shapes of ``log(best at the end / best
of the seeds)``, over the run's GPU seconds) and *child gain per GPU-second* (the bandit's
measure: summed ``max(0, log(child / parent))``), and best speedup over GPU time (geometric mean
over the shapes of the best speedup so far, sampled at fixed GPU-second marks). Writes
DIR/runs/ARM/sSEED (archives), DIR/ablation.json, DIR/ablation.md (the table, with the command;
an LLM arm whose seeds together had fewer than ``MIN_LLM_EVALUATED`` LLM children evaluated is
marked "LLM not exercised" there and ``llm_exercised: false`` in the JSON: it measured knob alone)
and DIR/best_over_time.png/.svg (matplotlib). Exit 0 when every arm ran, 1 when a run failed, 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shlex
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "scripts"))

from evo.rl import ShapeSplit, read_layers, split_by_model  # noqa: E402
from operator_shares import shares as operator_rows  # noqa: E402
from _ablation_stats import vs_base  # noqa: E402
from populations import Archive, Shape, Status  # noqa: E402

#: arm -> (operators, extra evo run flags); "{adapter}" is replaced by --adapter's folder
ARMS: dict[str, tuple[str, tuple[str, ...]]] = {
    "knob": ("knob", ()),
    "knob+optuna": ("knob:1,optuna:1", ()),
    # issue 35: knob operators beside the ranking step (64 knob children, the tabular cost model's best 4)
    "knob+ranked": ("knob:1,ranked:1", ()),
    "knob+llm": ("knob:1,llm:1", ()),
    "knob+llm_adapter": ("knob:1,llm:1", ("--llm-adapter", "{adapter}")),
    # issue 35: the LLM as the ranking step's cost model (llm_ranked: 4 of 64 knob children by the
    # log-likelihood of their edit), with the base model and with --adapter
    "knob+llm_ranker": ("knob:1,llm_ranked:1", ()),
    "knob+llm_ranker_adapter": ("knob:1,llm_ranked:1", ("--llm-adapter", "{adapter}")),
    "bandit": ("knob:1,optuna:1,llm:1", ("--operator-bandit",)),
}
NEEDS_ADAPTER = {"knob+llm_adapter"}
#: every arm that runs with --adapter (the version table compares the generator arms only)
ADAPTER_ARMS = NEEDS_ADAPTER | {"knob+llm_ranker_adapter"}
#: an adapter arm of one version: ``knob+llm_adapter@vN`` runs ``knob+llm_adapter`` with adapter vN
VERSIONED = re.compile(r"^knob\+llm_adapter@v(\d+)$")
TINY_ARMS = ("knob", "knob+optuna", "knob+ranked", "bandit")
#: GPU-second marks of the best-over-time curve, as fractions of the budget
MARKS = tuple(i / 20 for i in range(1, 21))
#: LLM children evaluated (all seeds of an arm together) below which an LLM arm did not measure
#: the LLM: its row is marked "LLM not exercised" and must not be read as a result
MIN_LLM_EVALUATED = 10


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="operator_ablation.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--split", type=Path, help="an evo rl split file (its test shapes are used)")
    p.add_argument("--layers", type=Path, help="llm_layers.csv: split it by model (seed 0) when --split is not given")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", type=int, default=6, help="test shapes sampled (default 6)")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--gpu-seconds", type=float, default=60.0, help="GPU budget per run (default 60)")
    p.add_argument("--wall-cap", type=float, default=0.0, help="wall-time cap per run in seconds (0: 4 x the GPU budget)")
    p.add_argument("--seeds-per-template", type=int, default=0,
                   help="evo run's cold-start seeds per template (0: evo's default); fewer leave a small GPU "
                        "budget to the operators being compared")
    p.add_argument("--call-s", type=float, default=0.0,
                   help="wall seconds this invocation may take (0: no limit): a run starts only when the time left "
                        "holds the arm's previous run (else the slowest so far, else --first-run-s), none runs past it")
    p.add_argument("--first-run-s", type=float, default=0.0,
                   help="expected wall seconds of a run before one has been timed (0: 25 + 1.6 x the GPU budget)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--adapter", type=Path, action="append", default=[],
                   help="an evo rl adapter (ADAPTER/vN folder); repeat it for several versions: the adapter arm then "
                        "runs once per version (knob+llm_adapter@vN), the bandit gets the latest")
    p.add_argument("--gpus", default="",
                   help="comma-separated GPU indices: runs go to them concurrently, one run per GPU at a time "
                        "(CUDA_VISIBLE_DEVICES set per run, so each run sees its GPU as cuda:0); default: one "
                        "run at a time on what the process sees")
    p.add_argument("--llm-device", default="cpu", help="cpu, or cuda[:N] (co-located with the timers: leased)")
    p.add_argument("--llm-threads", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the shapes and every run's evo run command, run nothing")
    p.add_argument("--report-only", action="store_true",
                   help="run nothing: rebuild DIR's report from the finished runs under --runs, measured again")
    p.add_argument("--runs", type=Path, help="with --report-only: the ARM/sSEED run folders (default DIR/runs)")
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: stand-in pool, two shapes, tiny budgets")
    # test-only: the module run as `python -m MODULE run ...` (fake_evo: evo with the stand-in pool)
    p.add_argument("--evo-module", default="evo", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.seed_list = [int(s) for s in str(args.seeds).split(",") if s.strip()]
    try:
        args.gpu_list = [int(g) for g in str(args.gpus).split(",") if g.strip()]
    except ValueError:
        p.error(f"--gpus takes comma-separated GPU indices, got {args.gpus!r}")
    if len(set(args.gpu_list)) != len(args.gpu_list) or any(g < 0 for g in args.gpu_list):
        p.error(f"--gpus: each index once and >= 0, got {args.gpus!r}")
    args.arm_list = [a.strip() for a in args.arms.split(",") if a.strip()]
    if args.tiny:
        args.evo_module = "fake_evo" if args.evo_module == "evo" else args.evo_module
        if args.arms == ",".join(ARMS):
            args.arm_list = list(TINY_ARMS)
    set_adapters(args, args.adapter)
    if len(args.adapters) > 1 and "knob+llm_adapter" in args.arm_list:  # one arm per version, in order
        i = args.arm_list.index("knob+llm_adapter")
        args.arm_list[i:i + 1] = [f"knob+llm_adapter@v{v}" for v, _ in args.adapters]
    unknown = [a for a in args.arm_list if a not in ARMS and not VERSIONED.match(a)]
    if unknown:
        p.error(f"unknown arms {unknown}; known: {', '.join(ARMS)}")
    if not (args.tiny or args.report_only) and args.split is None and args.layers is None:
        p.error("give --split or --layers (or --tiny)")
    return args


def adapter_version(folder: Path) -> int:
    """An adapter folder's version: its evo-adapter.json's, else the N of a folder named vN, else 0."""
    try:
        return int(json.loads((folder / "evo-adapter.json").read_text())["version"])
    except (OSError, ValueError, KeyError, TypeError):
        m = re.match(r"^v(\d+)$", folder.name)
        return int(m.group(1)) if m else 0


def set_adapters(args: argparse.Namespace, folders: Iterable[Path]) -> None:
    """``args.adapters``: (version, folder) in version order; ``args.adapter``: the latest (the bandit's)."""
    args.adapters = sorted(((adapter_version(a), a) for a in folders), key=lambda va: va[0])
    args.adapter = args.adapters[-1][1] if args.adapters else None


def missing_adapter(args: argparse.Namespace, arm: str) -> Optional[str]:
    """Why an adapter arm cannot run (no adapter, or none of its version given); None when it can,
    and for every arm that needs none."""
    m = VERSIONED.match(arm)
    if not (arm in ADAPTER_ARMS or m) or arm_adapter(args, arm) is not None:
        return None
    return "no --adapter given" if m is None else f"no adapter of version {m.group(1)} given"


def arm_adapter(args: argparse.Namespace, arm: str) -> Optional[Path]:
    """The adapter folder an arm runs with: its version's for knob+llm_adapter@vN, the latest for
    knob+llm_adapter and the bandit, none for the others (or when no adapter of that version was given)."""
    m = VERSIONED.match(arm)
    if m:
        return next((a for v, a in args.adapters if v == int(m.group(1))), None)
    return args.adapter if arm in ADAPTER_ARMS or arm == "bandit" else None


# -- shapes -------------------------------------------------------------------------------------
def test_shapes(args: argparse.Namespace) -> tuple[list[Shape], dict[str, Any]]:
    """The held-out shapes every arm runs on, and where they came from."""
    if args.tiny:
        return [Shape(64, 256, 512), Shape(8, 512, 256)], {"source": "tiny"}
    if args.split is not None:
        split = ShapeSplit.read(args.split)
    else:
        split = split_by_model(read_layers(args.layers), seed=0)
    return sample_shapes(split.test, args.shapes, seed=0), {"source": str(args.split or args.layers),
                                                           "test_models": split.test_models}


def sample_shapes(shapes: Sequence[Shape], n: int, seed: int = 0) -> list[Shape]:
    """``n`` shapes spread over the shape classes (round robin over classes, seeded order within)."""
    from operators.llm._context import shape_class

    by_class: dict[str, list[Shape]] = defaultdict(list)
    for s in sorted(set(shapes), key=str):
        by_class[shape_class(s).name].append(s)
    rng = random.Random(seed)
    for members in by_class.values():
        rng.shuffle(members)
    out: list[Shape] = []
    while len(out) < n and any(by_class.values()):
        for name in sorted(by_class):
            if by_class[name] and len(out) < n:
                out.append(by_class[name].pop())
    return out


# -- runs ---------------------------------------------------------------------------------------
def run_command(args: argparse.Namespace, arm: str, seed: int, shapes: Sequence[Shape], archive: Path,
                wall_cap: float = 0.0) -> list[str]:
    """The ``evo run`` command line of one (arm, seed); ``wall_cap``: its wall budget (default
    ``--wall-cap``, else 4 x the GPU budget)."""
    ops, extra = ARMS["knob+llm_adapter" if VERSIONED.match(arm) else arm]
    if args.tiny and arm == "bandit":
        ops = "knob:1,optuna:1"  # the smoke test loads no model
    cmd = [sys.executable, "-m", args.evo_module, "run", "--archive", str(archive), "--operators", ops, "--seed", str(seed),
           "--progress", "plain", "--gpu-seconds", f"{args.gpu_seconds:g}",
           "--budget", f"{wall_cap or args.wall_cap or 4 * args.gpu_seconds:.1f}"]  # evo reads no 1e+03
    for s in shapes:
        cmd += ["--shape", str(s)]
    if args.seeds_per_template:
        cmd += ["--seeds-per-template", str(args.seeds_per_template)]
    if "llm" in ops:
        cmd += ["--llm-device", args.llm_device]
        if args.llm_threads:
            cmd += ["--llm-threads", str(args.llm_threads)]
    adapter = arm_adapter(args, arm)
    cmd += [x.replace("{adapter}", str(adapter or "")) for x in extra]
    if arm == "bandit" and adapter:
        cmd += ["--llm-adapter", str(adapter)]
    return cmd


class CallClock:
    """The invocation's wall budget (``--call-s``): whether the next run fits, and its wall cap.

    A run of an arm is expected to take as long as that arm's previous run in this invocation
    (its first, cold-cache run is the slow one), else the slowest run so far, else
    ``--first-run-s``; one that does not fit is not started, so a call cut short leaves whole
    runs, and with seeds outermost, every arm with the same number of seeds or one fewer."""

    def __init__(self, call_s: float, first_run_s: float, start: Optional[float] = None) -> None:
        self.call_s, self.first_run_s = call_s, first_run_s
        self.start = time.monotonic() if start is None else start
        self.slowest = 0.0
        self.last: dict[str, float] = {}

    def left(self, now: Optional[float] = None) -> float:
        return self.call_s - ((time.monotonic() if now is None else now) - self.start) if self.call_s else math.inf

    def expected(self, arm: str = "") -> float:
        return self.last.get(arm) or self.slowest or self.first_run_s

    def fits(self, arm: str = "", now: Optional[float] = None) -> bool:
        return self.left(now) >= self.expected(arm)

    def ran(self, wall_s: float, arm: str = "") -> None:
        self.slowest = max(self.slowest, wall_s)
        self.last[arm] = wall_s


def run_arm(args: argparse.Namespace, arm: str, seed: int, shapes: Sequence[Shape],
            clock: Optional[CallClock] = None, gpu: Optional[int] = None) -> dict[str, Any]:
    """One (arm, seed) run of ``evo run`` (on GPU ``gpu`` alone when given), measured; a finished
    run is read back, not run again."""
    archive = args.out / "runs" / arm / f"s{seed}"
    why = missing_adapter(args, arm)
    if why:
        return {"arm": arm, "seed": seed, "skipped": why}
    if (archive / "done.json").is_file():  # resumable: a finished run is read (measured again), not run again
        return read_run(archive)
    clock = clock or CallClock(0.0, 0.0)
    if not clock.fits(arm):
        return {"arm": arm, "seed": seed, "not_started": f"{clock.left():.0f} s of the call left, a run takes "
                                                          f"~{clock.expected(arm):.0f} s"}
    archive.parent.mkdir(parents=True, exist_ok=True)
    if archive.exists():  # an unfinished run of an earlier call: start it again from nothing
        import shutil
        shutil.rmtree(archive)
    wall_cap = min(args.wall_cap or 4 * args.gpu_seconds, max(clock.left() - 10, 1.0))
    cmd = run_command(args, arm, seed, shapes, archive, wall_cap)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]))
    if args.tiny:
        env.setdefault("EVO_FAKE_GPU_S", "0.05")
    if gpu is not None:  # the run sees its GPU as device 0; the LLM's cuda[:0] placement follows it
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    t0 = time.time()
    log = archive.parent / f"s{seed}.log"
    with open(log, "w") as fh:
        rc = subprocess.call(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                             timeout=wall_cap + 120)  # evo run stops itself at wall_cap; in-flight jobs end
    out = {"arm": arm, "seed": seed, "rc": rc, "wall_s": round(time.time() - t0, 1), "command": shlex.join(cmd[1:]),
           "uses_llm": "llm" in cmd[cmd.index("--operators") + 1], **({"gpu": gpu} if gpu is not None else {})}
    clock.ran(out["wall_s"], arm)
    if rc != 0 or not archive.is_dir():
        out["error"] = f"evo run exited {rc} (log {log})"
        return out
    out.update(measure(archive, shapes, args.gpu_seconds))
    (archive / "done.json").write_text(json.dumps(out))
    return out


def command_options(command: str) -> dict[str, list[str]]:
    """The ``--option value`` pairs of a run's recorded ``evo run`` command, every value of each."""
    words = shlex.split(command)
    out: dict[str, list[str]] = defaultdict(list)
    for i, w in enumerate(words[:-1]):
        if w.startswith("--") and not words[i + 1].startswith("--"):
            out[w[2:]].append(words[i + 1])
    return out


def read_run(archive: Path) -> dict[str, Any]:
    """A finished run (its done.json) with every figure measured again from its archive, on the
    shapes and GPU budget of its own command: a report made by a later version of this script
    counts what that version counts (--report-only, and the resumed runs of a call)."""
    run = json.loads((archive / "done.json").read_text())
    opts = command_options(run.get("command", ""))
    shapes = [Shape.parse(s) for s in opts.get("shape", [])]
    budget = float((opts.get("gpu-seconds") or ["0"])[0])
    run.update(measure(archive, shapes, budget))
    run["uses_llm"] = "llm" in (opts.get("operators") or [""])[0]
    return run


def report_only(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Rebuild the report from the finished runs under ``--runs`` (ARM/sSEED folders with a
    done.json), measured again; the budget, seeds and LLM placement are read from their commands."""
    runs_dir = args.runs or args.out / "runs"
    if not runs_dir.is_dir():
        print(f"operator_ablation: error: no runs folder {runs_dir}", file=sys.stderr)
        return 2
    arms = [a for a in ARMS if (runs_dir / a).is_dir()] + sorted(
        d.name for d in runs_dir.iterdir() if d.is_dir() and d.name not in ARMS)
    runs: list[dict[str, Any]] = []
    for arm in arms:
        for folder in sorted((runs_dir / arm).glob("s*"), key=lambda d: d.name):
            if not folder.is_dir() or not folder.name[1:].isdigit():
                continue
            if (folder / "done.json").is_file():
                runs.append(read_run(folder))
            else:
                runs.append({"arm": arm, "seed": int(folder.name[1:]), "error": f"unfinished: no done.json in {folder}"})
    finished = [r for r in runs if "command" in r]
    if not finished:
        print(f"operator_ablation: error: no finished run (ARM/sSEED/done.json) under {runs_dir}", file=sys.stderr)
        return 2
    opts = command_options(finished[0]["command"])
    args.gpu_seconds = float(opts["gpu-seconds"][0])
    args.seed_list = sorted({r["seed"] for r in runs})
    adapters: dict[str, Path] = {}
    for r in finished:
        o = command_options(r["command"])
        args.llm_device = (o.get("llm-device") or [args.llm_device])[0]
        for a in o.get("llm-adapter", []):
            adapters[a] = Path(a)
    set_adapters(args, adapters.values())
    shapes = [Shape.parse(s) for s in opts.get("shape", [])]
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"source": f"the runs under {runs_dir}"}
    if (args.out / "ablation.json").is_file():  # the report being rebuilt: keep where its shapes came from
        meta = json.loads((args.out / "ablation.json").read_text()).get("meta") or meta
    write_report(args, shapes, meta, runs, argv)
    print((args.out / "ablation.md").read_text())
    return 0


# -- measures -----------------------------------------------------------------------------------
def _events(archive: Path) -> list[dict[str, Any]]:
    path = archive / "events.jsonl"
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def measure(archive: Path, shapes: Sequence[Shape], budget_s: float) -> dict[str, Any]:
    """The per-run figures of the module docstring, from the archive and its events."""
    n = valid = flagged = with_parent = improving = 0
    gain = 0.0
    improvement = 0.0
    with Archive(archive, mode="r") as ar:
        for shape in ar.shapes():
            cands = {c.id: c for c in ar.candidates(shape)}
            latest = {}
            for ev in ar.evaluations(shape):
                latest[ev.candidate_id] = ev
            seed_best = max((ev.fitness for cid, ev in latest.items() if ev.fitness and not ev.flags
                             and cid in cands and not cands[cid].parents), default=None)
            best = max((ev.fitness for ev in latest.values() if ev.fitness and not ev.flags), default=None)
            if seed_best and best:
                improvement += math.log(best / seed_best)
            for cid, ev in latest.items():
                cand = cands.get(cid)
                n += 1
                ok = ev.status is Status.OK and not ev.flags
                valid += ok
                flagged += bool(ev.flags) or ev.status is Status.FLAGGED
                if cand is None or not cand.parents:
                    continue
                with_parent += 1
                parents = [latest[p].fitness for p in cand.parents if p in latest and not latest[p].flags]
                parent = max((f for f in parents if f), default=None)
                if ok and ev.fitness and parent:
                    g = math.log(ev.fitness / parent)
                    if g > 0:
                        improving += 1
                        gain += g
        llm_rows = [r for key, r in operator_rows(ar).items() if key.startswith("llm") and "/" not in key]
    events = _events(archive)
    stop = next((e for e in reversed(events) if e.get("event") == "stop"), {})
    budget = stop.get("budget", {})
    gpu_s = float(budget.get("gpu_s") or 0.0)
    proposals = sum(int(counts.get("proposed", 0)) for op, per_model in (stop.get("models") or {}).items()
                    if op.startswith("llm") for counts in per_model.values())
    return {"evaluations": n, "valid_share": _share(valid, n), "improving_share": _share(improving, with_parent),
            "flagged_share": _share(flagged, n), "gpu_s": round(gpu_s, 3),
            # what the run's LLM did (scripts/operator_shares.py's sources): every token it spent,
            # failed calls included (the stop event's budget), and its children in the archive
            "tokens": int(budget.get("tokens") or 0), "llm_proposals": proposals,
            "llm_evaluated": sum(r["evaluated"] for r in llm_rows), "llm_improved": sum(r["improved"] for r in llm_rows),
            "llm_gpu_s": float(budget.get("llm_gpu_s") or 0.0),  # held (charged); the old charge added the waits
            "llm_gpu_wait_s": float(budget.get("llm_gpu_wait_s") or 0.0),
            "improvement_per_gpu_s": round(improvement / gpu_s, 6) if gpu_s else None,
            "child_gain_per_gpu_s": round(gain / gpu_s, 6) if gpu_s else None,
            "best_over_time": best_over_time(events, shapes, budget_s), "stop": stop.get("reason"),
            "placement": next((e for e in events if e.get("event") == "llm_placement"), {}).get("where"),
            "bandit": stop.get("bandit")}


def _share(a: int, b: int) -> Optional[float]:
    return round(a / b, 4) if b else None


def best_over_time(events: Sequence[dict[str, Any]], shapes: Sequence[Shape], budget_s: float) -> list[Optional[float]]:
    """Geometric mean over ``shapes`` of the best speedup so far at each mark of ``MARKS`` x the GPU
    budget (None until every shape has a valid result), from the evaluation events in order."""
    best: dict[str, float] = {}
    names = {str(s) for s in shapes}
    used, out, marks = 0.0, [], [m * budget_s for m in MARKS]
    i = 0
    for e in events:
        if e.get("event") != "evaluation":
            continue
        used += float(e.get("gpu_s") or 0.0)
        while i < len(marks) and used > marks[i]:
            out.append(_geomean(best, names))
            i += 1
        fit = e.get("fitness")
        if fit and e.get("status") == "ok" and e.get("shape") in names:
            best[e["shape"]] = max(best.get(e["shape"], 0.0), float(fit))
    while i < len(marks):
        out.append(_geomean(best, names))
        i += 1
    return out


def _geomean(best: dict[str, float], names: set[str]) -> Optional[float]:
    if not names or set(best) < names:
        return None
    return round(math.exp(statistics.fmean(math.log(best[n]) for n in names)), 5)


# -- report -------------------------------------------------------------------------------------
FIELDS = ("evaluations", "valid_share", "improving_share", "flagged_share", "tokens", "llm_proposals",
          "llm_evaluated", "llm_improved", "llm_gpu_s", "llm_gpu_wait_s", "gpu_s", "improvement_per_gpu_s", "child_gain_per_gpu_s")


def summarise(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per arm: mean, min and max over its seeds of every field, and the mean curve."""
    by_arm: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in runs:
        by_arm[r["arm"]].append(r)
    out = {}
    for arm, rs in by_arm.items():
        done = [r for r in rs if "evaluations" in r]
        row: dict[str, Any] = {"runs": len(done), "skipped": next((r["skipped"] for r in rs if "skipped" in r), None),
                               "errors": [r["error"] for r in rs if "error" in r],
                               "seeds": sorted(r["seed"] for r in done),
                               "not_started": sorted(r["seed"] for r in rs if "not_started" in r),
                               # a run the wall cap stopped short of its GPU budget is not at equal cost
                               "short": sorted(r["seed"] for r in done if r.get("stop") != "gpu_seconds"),
                               "wall_s": _mean([r.get("wall_s") for r in done])}
        for f in FIELDS:
            vals = [r[f] for r in done if r.get(f) is not None]
            row[f] = {"mean": round(statistics.fmean(vals), 6), "min": min(vals), "max": max(vals)} if vals else None
        # an LLM arm measured the LLM only when enough of its children were evaluated
        llm_total = sum(int(r.get("llm_evaluated") or 0) for r in done)
        uses_llm = any(r.get("uses_llm") for r in rs)
        row["llm_evaluated_total"] = llm_total if uses_llm else None
        row["llm_improved_total"] = sum(int(r.get("llm_improved") or 0) for r in done) if uses_llm else None
        row["llm_exercised"] = (llm_total >= MIN_LLM_EVALUATED) if uses_llm and done else None
        curves = [r["best_over_time"] for r in done]
        row["best_over_time"] = [_mean([c[i] for c in curves]) for i in range(len(MARKS))] if curves else []
        out[arm] = row
    return out


def adapter_versions(summary: dict[str, dict[str, Any]], runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 25's version check on the test split: the base model (version 0, arm knob+llm) and each
    adapter arm's version, in order, with its LLM children evaluated and improving over all seeds,
    the improving share, and whether that share is above the previous version's (None for the
    first, or where either side had no LLM child evaluated)."""
    version_of: dict[str, int] = {}
    for r in runs:
        m = VERSIONED.match(r.get("arm", ""))
        if m:
            version_of[r["arm"]] = int(m.group(1))
        elif r.get("arm") in NEEDS_ADAPTER and r.get("command"):
            folders = command_options(r["command"]).get("llm-adapter") or []
            if folders:
                version_of[r["arm"]] = adapter_version(Path(folders[0]))
    rows = []
    for arm, version in [("knob+llm", 0)] + sorted(version_of.items(), key=lambda kv: kv[1]):
        row = summary.get(arm)
        if not row or row.get("llm_evaluated_total") is None:
            continue
        n, k = row["llm_evaluated_total"], row["llm_improved_total"] or 0
        rows.append({"arm": arm, "version": version, "seeds": row["seeds"], "llm_evaluated": n, "llm_improved": k,
                     "improving_share": _share(k, n)})
    for prev, cur in zip(rows, rows[1:]):
        a, b = prev["improving_share"], cur["improving_share"]
        cur["above_previous"] = None if a is None or b is None else b > a
    if rows:
        rows[0]["above_previous"] = None
    return rows


def _seeds_cell(row: dict[str, Any]) -> str:
    """``n (s0,s1)`` plus the seeds not started and the runs stopped short."""
    out = f"{row['runs']} ({','.join(map(str, row['seeds'])) or '-'})"
    if row.get("not_started"):
        out += f"; not started: {','.join(map(str, row['not_started']))}"
    if row.get("short"):
        out += f"; short: {','.join(map(str, row['short']))}"
    if row.get("errors"):
        out += f"; {len(row['errors'])} failed"
    return out


def _mean(xs: Sequence[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return round(statistics.fmean(vals), 5) if vals else None


def write_report(args: argparse.Namespace, shapes: Sequence[Shape], meta: dict[str, Any],
                 runs: Sequence[dict[str, Any]], argv: Sequence[str]) -> dict[str, Any]:
    summary = summarise(runs)
    versions = adapter_versions(summary, runs)
    doc = {"format": "evo-operator-ablation/1", "shapes": [str(s) for s in shapes], "meta": meta,
           "gpu_seconds": args.gpu_seconds, "seeds": args.seed_list, "llm_device": args.llm_device,
           "adapter": str(args.adapter) if args.adapter else None, "marks": list(MARKS), "arms": summary,
           "adapter_versions": versions, "vs_knob": vs_base(runs),
           "runs": list(runs), "command": "python bench/operator_ablation.py " + shlex.join(argv)}
    (args.out / "ablation.json").write_text(json.dumps(doc, indent=1))

    def cell(v: Any, pct: bool = False) -> str:
        if v is None:
            return "-"
        m = v["mean"]
        return f"{100 * m:.1f}%" if pct else f"{m:.4g}"
    lines = [f"Command: `{doc['command']}`", "",
             f"Shapes ({meta.get('source')}; test models {', '.join(meta.get('test_models', [])) or '-'}): "
             + ", ".join(doc["shapes"]), "",
             f"{args.gpu_seconds:g} GPU-s per run, seeds {','.join(map(str, args.seed_list))}, LLM on {args.llm_device}; means over seeds.", "",
             "| arm | seeds run | evaluations | valid | improving | flagged | tokens | LLM proposals "
             "| LLM evaluated | LLM improving | LLM GPU-s held | LLM lease wait s | GPU-s | wall s "
             "| improvement / GPU-s | child gain / GPU-s | best speedup (end) |",
             "|" + "---|" * 17]
    for arm, row in summary.items():
        if row["skipped"] and not row["runs"]:
            lines.append(f"| {arm} | 0 | not run: {row['skipped']} |" + " |" * 14)
            continue
        end = next((v for v in reversed(row["best_over_time"]) if v is not None), None)
        name = arm if row.get("llm_exercised") is not False else (
            f"{arm} (the bandit gave the LLM {row['llm_evaluated_total']} evaluated children: its choice, not a "
            "measurement of the LLM)" if arm == "bandit" else
            f"{arm} **LLM not exercised** ({row['llm_evaluated_total']} LLM children evaluated < {MIN_LLM_EVALUATED})")
        lines.append(f"| {name} | {_seeds_cell(row)} | {cell(row['evaluations'])} | {cell(row['valid_share'], True)} | "
                     f"{cell(row['improving_share'], True)} | {cell(row['flagged_share'], True)} | {cell(row['tokens'])} | "
                     f"{cell(row['llm_proposals'])} | {cell(row['llm_evaluated'])} | {cell(row['llm_improved'])} | "
                     f"{cell(row['llm_gpu_s'])} | {cell(row.get('llm_gpu_wait_s'))} | {cell(row['gpu_s'])} | "
                     f"{row['wall_s'] or '-'} | "
                     f"{cell(row['improvement_per_gpu_s'])} | {cell(row['child_gain_per_gpu_s'])} | "
                     f"{'-' if end is None else f'{end:.3f}'} |")
    if doc["vs_knob"]:
        def ci(v: dict[str, Any]) -> str:
            if v["ratio"] is None:
                return "-"
            return f"{v['ratio']:.2f}x" + (f" [{v['lo']:.2f}, {v['hi']:.2f}]" if v["lo"] is not None else "")
        lines += ["", "Against knob alone, paired by seed: the ratio of the means over the seeds both arms finished, "
                  "with a bootstrap 95% interval (bench/_ablation_stats.py):", "",
                  "| arm | pairs | improvement / GPU-s | best speedup (end) |", "|---|---|---|---|"]
        for arm, row in doc["vs_knob"].items():
            lines.append(f"| {arm} | {row['improvement_per_gpu_s']['pairs']} | {ci(row['improvement_per_gpu_s'])} | "
                         f"{ci(row['best_speedup_end'])} |")
    if len(versions) > 1:
        lines += ["", "Adapter versions on the test split (LLM children of all seeds; version 0 is the base model):", "",
                  "| version | arm | seeds | LLM children evaluated | improving their parent | share | above the previous |",
                  "|---|---|---|---|---|---|---|"]
        for v in versions:
            above = {None: "-", True: "yes", False: "**no**"}[v.get("above_previous")]
            share = "-" if v["improving_share"] is None else f"{100 * v['improving_share']:.1f}%"
            lines.append(f"| {v['version']} | {v['arm']} | {','.join(map(str, v['seeds'])) or '-'} | {v['llm_evaluated']} | "
                         f"{v['llm_improved']} | {share} | {above} |")
    lines += ["", "Seeds run: the seeds each arm finished (of the seeds asked for); \"not started\": the call's "
              "time (--call-s) ran out first; \"short\": a run the wall cap stopped before its GPU budget "
              "(its cost is not equal to the others'). Tokens and LLM columns: means per run; \"LLM not exercised\": "
              f"an LLM arm whose seeds together had fewer than {MIN_LLM_EVALUATED} LLM children evaluated: it "
              "measured the other operators, not the LLM, and is no result about the LLM."]
    (args.out / "ablation.md").write_text("\n".join(lines) + "\n")
    plot_best_over_time(args.out, summary, args.gpu_seconds)
    return doc


def plot_best_over_time(out: Path, summary: dict[str, dict[str, Any]], budget_s: float) -> Optional[Path]:
    """DIR/best_over_time.png and .svg: per arm, the mean over seeds of the best speedup
    (geomean over the shapes) against the GPU seconds spent; None when no arm has a curve."""
    series = {arm: row["best_over_time"] for arm, row in summary.items()
              if any(v is not None for v in row.get("best_over_time", []))}
    if not series:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [m * budget_s for m in MARKS]
    fig, ax = plt.subplots(figsize=(6.4, 4.0), dpi=110)
    for arm, ys in series.items():
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        seeds = summary[arm]["seeds"]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"{arm} (seeds {','.join(map(str, seeds))})")
    ax.set_xlabel("GPU seconds spent (the LLM's included)")
    ax.set_ylabel("best speedup vs cuBLAS (geomean over shapes)")
    ax.set_title(f"Best speedup over GPU time, {budget_s:g} GPU-s per run, mean over seeds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(out / f"best_over_time.{ext}")
    plt.close(fig)
    return out / "best_over_time.png"


def run_jobs(args: argparse.Namespace, jobs: Sequence[tuple[int, str]], shapes: Sequence[Shape], clock: CallClock,
             report: Any) -> list[dict[str, Any]]:
    """Every (seed, arm) job, in order, on ``args.gpu_list``'s GPUs one run per GPU at a time (or one
    run at a time with no list); ``report(runs)`` after each run ends, so a killed call keeps its
    table. Results come back in job order."""
    import threading

    lock = threading.Lock()
    results: dict[int, dict[str, Any]] = {}
    queue = list(enumerate(jobs))

    def done(i: int, r: dict[str, Any]) -> None:
        with lock:
            results[i] = r
            print(f"operator_ablation: {r['arm']} s{r['seed']}: " + json.dumps({k: r.get(k) for k in
                  ("gpu", "skipped", "not_started", "error", "wall_s", "evaluations", "valid_share", "improving_share",
                   "flagged_share", "improvement_per_gpu_s", "llm_gpu_s", "gpu_s", "stop")}), flush=True)
            report([results[j] for j in sorted(results)])

    def worker(gpu: Optional[int]) -> None:
        while True:
            with lock:
                if not queue:
                    return
                i, (seed, arm) = queue.pop(0)
            done(i, run_arm(args, arm, seed, shapes, clock, gpu))

    gpus: list[Optional[int]] = list(args.gpu_list) or [None]
    threads = [threading.Thread(target=worker, args=(g,), name=f"ablation-gpu{g}") for g in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [results[i] for i in sorted(results)]


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.report_only:
        return report_only(args, argv)
    if args.tiny:
        args.gpu_seconds = min(args.gpu_seconds, 3.0)
        args.seed_list = args.seed_list[:2]
    try:
        shapes, meta = test_shapes(args)
    except (OSError, ValueError, KeyError) as exc:
        print(f"operator_ablation: error: {exc}", file=sys.stderr)
        return 2
    for _, adapter in args.adapters:
        if not (adapter / "evo-adapter.json").is_file():
            print(f"operator_ablation: error: --adapter {adapter} has no evo-adapter.json", file=sys.stderr)
            return 2
    if args.dry_run:
        print(f"operator_ablation: test shapes {' '.join(map(str, shapes))} (test models "
              f"{', '.join(meta.get('test_models', [])) or '-'})")
        for seed in args.seed_list:
            for arm in args.arm_list:
                why = missing_adapter(args, arm)
                if why:
                    print(f"operator_ablation: {arm} s{seed}: not run ({why})")
                    continue
                cmd = run_command(args, arm, seed, shapes, args.out / "runs" / arm / f"s{seed}")
                print(f"operator_ablation: {arm} s{seed}: {shlex.join(cmd[1:])}")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"operator_ablation: {len(shapes)} shapes, arms {', '.join(args.arm_list)}, seeds {args.seed_list}, "
          f"{args.gpu_seconds:g} GPU-s each", flush=True)
    clock = CallClock(args.call_s, args.first_run_s or 25 + 1.6 * args.gpu_seconds)
    jobs = [(seed, arm) for seed in args.seed_list for arm in args.arm_list]  # seeds outermost: a cut-short call
    runs = run_jobs(args, jobs, shapes, clock, lambda done: write_report(args, shapes, meta, done, argv))  # still has every arm once
    if not runs:
        write_report(args, shapes, meta, runs, argv)
    print((args.out / "ablation.md").read_text())
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
