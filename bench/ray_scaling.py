"""Ray pool scaling: evaluations per hour on 1, 2, 4, 8 GPUs, on one host and as a two-node
cluster on one host, and with faults injected (issues 10 and 23).

    python bench/ray_scaling.py [--seconds 100] [--warmup 10] [--shapes 2048x2048x2048,4096x4096x4096]
                                [--shape-set issue23] [--legs ray1,ray2] [--ray local|auto|HOST:6379]
                                [--kill-every 300] [--node-down 10] [--out DIR]

Each leg runs the real engine (knob operators: mutation, crossover, random; no Optuna needed) on
a fresh archive once its pool is up (GPU actors started, health probes passed: start-up is not
counted) for ``--warmup`` + ``--seconds`` of wall time, and counts the evaluations that finished
in the last ``--seconds`` (``evaluation`` events of the run's ``events.jsonl``): steady state,
not the pipeline filling. Legs (N: GPUs):

- ``rayN``: RayPool with N GPU actors on one Ray cluster (``--ray local``: a fresh one here per
  leg, declaring ``--num-gpus`` or what Ray detects; ``auto``/``HOST:PORT``: a running one);
- ``localN``: LocalPool on GPUs 0..N-1, for comparison;
- ``nodesN``: RayPool with N actors on a two-node cluster on this host: two ``ray start``
  processes with half of the GPUs each (``CUDA_VISIBLE_DEVICES``) and half of the CPUs, so
  actors and compile tasks run on both raylets (``bench/_ray_nodes.py``);
- ``faultN``: ``rayN`` with one GPU actor killed every ``--kill-every`` seconds (slots in turn);
- ``nodefaultN``: ``nodesN`` with the second node killed (every process of its raylet) every
  ``--kill-every`` seconds and started again ``--node-down`` seconds later.

Fault legs check (``bench/_ray_faults.py``) that no record committed before a fault is missing at
the end, that every candidate handed to the pool has its evaluation, that the replacement actor
serves within 30 s of the capacity's return, and that the evaluation rate 30-60 s after it is
back to 0.9 of the rate in the 30 s before the fault.

Figures per leg: evaluations per hour and per GPU-hour, the best-speedup geomean (over the
shapes with an ok result: each shape's best device speedup over cuBLAS in this leg) and how many
shapes had one. Scaling efficiency of an N-GPU leg = (its rate / the 1-GPU leg's rate) / N,
against the ``ray1`` leg (``local1`` for local legs); targets: 0.9 at 2 GPUs (1.8x, issue 10),
0.85 at 4 and 0.75 at 8 (issue 23). ``--shape-set issue23`` is issue 23's list: all 143 shapes
of ``../shared/shapes/llm_layers.csv`` plus the 100 grid shapes of ``seed_bench --list --n
100``. With a handful of shapes, the harness's two-shape buffer cache favours legs with more
actors (fewer shapes each): the default two shapes measure parallelism only.

Prints one line per leg, and writes ``ray_scaling.json`` and ``ray_scaling.csv`` under
``--out`` (default: $OUT or .) after every leg. Exits 1 when a leg fails or evaluates nothing,
or a fault leg loses a committed record (or leaves a candidate unevaluated that the engine did
not abandon at the end of its budget); 2 on bad input; a missed target is reported, not an
error.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from populations import Archive, Shape, ShapeError, load_templates  # noqa: E402

TARGET = 1.8                                  # 2 GPUs against 1 (issue 10)
EFFICIENCY = {2: 0.9, 4: 0.85, 8: 0.75}      # scaling efficiency targets (issue 23)
KINDS = ("ray", "local", "nodes", "fault", "nodefault")


def leg_spec(name: str) -> tuple[str, int]:
    """``ray4`` -> ("ray", 4); ValueError for a name that is not KIND + GPU count."""
    m = re.fullmatch(r"([a-z]+?)(\d+)", name)
    if not m or m.group(1) not in KINDS or int(m.group(2)) < 1:
        raise ValueError(name)
    kind, gpus = m.group(1), int(m.group(2))
    if kind in ("nodes", "nodefault") and gpus < 2:
        raise ValueError(f"{name}: a two-node leg needs at least 2 GPUs")
    return kind, gpus


def llm_layers_csv() -> Path:
    """``shapes/llm_layers.csv`` in the first shared folder found (llm_layers_bench's list:
    ../shared beside the checkout, a carried copy on the device)."""
    from llm_layers_bench import CSV_DEFAULTS

    for path in CSV_DEFAULTS:
        if os.path.isfile(path):
            return Path(path)
    raise FileNotFoundError(f"llm_layers.csv not found in any of {', '.join(CSV_DEFAULTS)}; give --llm-shapes")


def issue23_shapes(llm_csv: Optional[Path] = None) -> list[Shape]:
    """All shapes of the LLM-layer list plus seed_bench's 100-shape grid sample (duplicates once)."""
    import seed_bench

    with open(llm_csv or llm_layers_csv(), newline="") as fh:
        llm = [Shape(int(r["M"]), int(r["N"]), int(r["K"])) for r in csv.DictReader(fh)]
    grid = seed_bench.stratified(seed_bench.read_grid(None), 100, 3)
    out: list[Shape] = []
    for s in llm + grid:
        if s not in out:
            out.append(s)
    return out


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=100.0, help="measured wall time per leg (default 100)")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="seconds each leg runs before its measured window opens (pipeline fill; default 10)")
    ap.add_argument("--shapes", default="2048x2048x2048,4096x4096x4096", help="comma-separated shapes")
    ap.add_argument("--shape-set", choices=["issue23"], default=None,
                    help="issue23: the 143 LLM-layer shapes + 100 grid shapes (replaces --shapes)")
    ap.add_argument("--llm-shapes", type=Path, default=None,
                    help="the LLM-layer CSV of --shape-set (default: shared/shapes/llm_layers.csv, found as llm_layers_bench does)")
    ap.add_argument("--legs", default="ray1,ray2",
                    help="comma-separated KIND+GPUs, KIND one of ray, local, nodes, fault, nodefault (ray1,ray4,nodes8)")
    ap.add_argument("--kill-every", type=float, default=300.0, help="fault legs: seconds between faults (default 300)")
    ap.add_argument("--recovery-window", type=float, default=30.0,
                    help="fault legs: the replacement must serve, and the rate be back, within this (default 30 s)")
    ap.add_argument("--node-down", type=float, default=10.0,
                    help="nodefault legs: seconds the killed node stays down (default 10)")
    ap.add_argument("--ray", default="local", help="local (a fresh cluster here), auto, or HOST:PORT")
    ap.add_argument("--compile-workers", type=int, default=max(2, min(12, (os.cpu_count() or 4) - 4)),
                    help="compiles in flight, the same in every leg (default: CPUs - 4, at most 12)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="folder for the archives (default: a temp folder, removed)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--num-gpus", type=int, default=None,
                    help="GPUs a cluster started here declares (default: what Ray detects)")
    ap.add_argument("--leg-child", default=None, help=argparse.SUPPRESS)  # internal: run one leg, write its row
    # CPU smoke test only: the GPU handler test double (tests/fake_gpu_worker.py), no measurement.
    ap.add_argument("--worker-target", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.shape_list = ([Shape.parse(s) for s in args.shapes.split(",") if s.strip()] if not args.shape_set
                           else issue23_shapes(args.llm_shapes))
    except ShapeError as exc:
        ap.error(f"--shapes: {exc}")
    except OSError as exc:
        ap.error(f"--shape-set issue23: {exc}")
    args.leg_list = [leg.strip() for leg in args.legs.split(",") if leg.strip()]
    bad = []
    for leg in args.leg_list:
        try:
            leg_spec(leg)
        except ValueError as exc:
            bad.append(str(exc))
    if bad or not args.leg_list:
        ap.error(f"--legs: bad {bad}; a leg is KIND+GPUs, KIND one of {', '.join(KINDS)}")
    if not args.seconds > 0 or args.warmup < 0 or not args.shape_list:
        ap.error("--seconds must be positive, --warmup not negative, and --shapes must name a shape")
    if not args.kill_every > 0 or args.node_down < 0 or not args.recovery_window > 0:
        ap.error("--kill-every and --recovery-window must be positive, --node-down not negative")
    return args


def make_pool(kind: str, gpus: int, args: argparse.Namespace, cache: str) -> Any:
    from evaluators import LocalPool, RayPool

    extra: dict[str, Any] = {}
    if args.worker_target:
        extra = {"target": args.worker_target, "arch": "sm_90a",
                 "deadlines": {"startup": 60.0, "probe": 20.0, "load": 10.0, "correctness": 10.0, "timing": 10.0}}
    if kind != "local":
        return RayPool(gpus=gpus, compile_workers=args.compile_workers, address="auto", cache_dir=cache, **extra)
    return LocalPool(gpus=list(range(gpus)), compile_workers=args.compile_workers, cache_dir=cache, **extra)


@contextmanager
def leg_cluster(kind: str, gpus: int, args: argparse.Namespace, work: Path) -> Iterator[Any]:
    """The Ray cluster a leg runs on, connected; yields the TwoNodes of a two-node leg, else None.
    ``--ray local``: a fresh single-node cluster per leg (shut down after it); otherwise the
    cluster named, joined once and kept."""
    from evaluators import connect_ray

    if kind == "local":
        yield None
        return
    import ray

    env = {"PYTHONPATH": os.pathsep.join(_worker_path())}
    if kind in ("nodes", "nodefault"):
        from _ray_nodes import TwoNodes

        if ray.is_initialized():
            ray.shutdown()
        ids = _gpu_ids(args)
        if len(ids) < gpus:
            raise RuntimeError(f"{gpus} GPUs asked for, {len(ids)} here")
        half = gpus // 2
        nodes = TwoNodes([ids[:half], ids[half:gpus]], os.cpu_count() or 2, work / f"nodes{gpus}-logs")
        try:
            ray.init(address=nodes.start(), log_to_driver=False, runtime_env={"env_vars": env})
            _wait_gpus(ray, gpus)
            yield nodes
        finally:
            ray.shutdown()
            nodes.stop()
        return
    if args.ray != "local":
        connect_ray(args.ray, runtime_env={"env_vars": env})
        yield None
        return
    init: dict[str, Any] = {"include_dashboard": False, "runtime_env": {"env_vars": env}}
    if args.num_gpus is not None:
        init["num_gpus"] = args.num_gpus
    connect_ray("local", **init)
    try:
        yield None
    finally:
        ray.shutdown()


def _worker_path() -> list[str]:
    root = str(HERE.parent)
    return [root, os.path.join(root, "tests")]  # tests/: the GPU handler test double of the smoke test


def _gpu_ids(args: argparse.Namespace) -> list[str]:
    """Physical GPU ids to split between two nodes: CUDA_VISIBLE_DEVICES, else nvidia-smi's;
    with ``--num-gpus`` on a machine without GPUs, logical ids 0..N-1."""
    from evaluators import visible_gpus

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        return [g.strip() for g in env.split(",") if g.strip()]
    ids = [str(g) for g in visible_gpus()]
    return ids or [str(i) for i in range(args.num_gpus or 0)]


def _wait_gpus(ray: Any, gpus: int, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while ray.cluster_resources().get("GPU", 0) < gpus:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cluster offers {ray.cluster_resources().get('GPU', 0):g} GPUs after "
                               f"{timeout_s:g} s, {gpus} needed")
        time.sleep(0.5)


def run_leg(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One leg: its cluster and pool, the engine for warm-up + seconds once the pool is up
    (faults injected on fault legs); the leg's figures."""
    kind, gpus = leg_spec(name)
    with leg_cluster(kind, gpus, args, work) as nodes:
        return _run_leg(name, kind, gpus, args, work, nodes)


def _run_leg(name: str, kind: str, gpus: int, args: argparse.Namespace, work: Path, nodes: Any) -> dict[str, Any]:
    from evo.cli._orchestrate import expand_operators, make_operators
    from evo.search._config import merge
    from evo.search._engine import Engine
    from evo.search._progress import EVENTS_FILE, EventLog, Progress, read_events

    archive_dir, cache = work / name, str(work / f"{name}-cubins")
    few = len(args.shape_list) <= 8
    cfg = merge({}, {"shapes": [str(s) for s in args.shape_list], "archive": str(archive_dir), "operators": "knob",
                     "seed": args.seed, "budget": args.warmup + args.seconds, "progress": "plain" if few else "none",
                     "pool": {"compile_workers": args.compile_workers, "gpus": list(range(gpus))}})
    cfg.operators = expand_operators(cfg.operators)
    print(f"[{name}] starting the {kind} pool with {gpus} GPU(s), {args.compile_workers} compile workers, "
          f"{len(args.shape_list)} shapes", flush=True)
    t_pool = time.monotonic()
    pool = make_pool(kind, gpus, args, cache)
    killer = None
    try:
        if kind != "local":
            if not pool.wait_ready(timeout=600):
                raise RuntimeError(f"not every GPU actor started: {pool.stats}")
            where = sorted(",".join(w["ray_gpu_ids"]) for w in pool.placement().values())
            hosts = len({w["ray_node_id"] for w in pool.placement().values()})
            print(f"[{name}] actors up on GPU(s) {where} ({hosts} node(s)) after {time.monotonic() - t_pool:.1f} s",
                  flush=True)
        else:
            _ = pool.arch  # waits until the first worker is up; then the others
            while any(not sup.info for sup in pool.supervisors) and time.monotonic() - t_pool < 600:
                time.sleep(0.1)
            print(f"[{name}] workers up after {time.monotonic() - t_pool:.1f} s", flush=True)
        started = time.monotonic()
        with Archive(archive_dir, "w") as archive:
            events = EventLog(archive_dir / EVENTS_FILE)
            engine = Engine(cfg, archive, pool, make_operators(cfg.operators), load_templates(errors="warn"),
                            events=events, progress=Progress(cfg.shapes, gpus, cfg.progress, 10.0))
            if kind in ("fault", "nodefault"):
                from _ray_faults import Killer

                killer = Killer(pool, archive_dir, args.shape_list, args.kill_every,
                                kind="node" if kind == "nodefault" else "actor", nodes=nodes, down_s=args.node_down)
                killer.start()
            try:
                result = engine.run()
            finally:
                if killer is not None:
                    killer.stop()
            events.close()
        elapsed = time.monotonic() - started
        stats = pool.stats
    finally:
        pool.close()
    evs = read_events(archive_dir / EVENTS_FILE)
    t0 = next(e["t"] for e in evs if e["event"] == "start")
    done = [e for e in evs if e["event"] == "evaluation"]
    inside = [e for e in done if args.warmup < e["t"] - t0 <= args.warmup + args.seconds]
    statuses = Counter(e["status"] for e in done)
    gpu_s = sum(float(e.get("gpu_s") or 0.0) for e in done)
    per_s = len(inside) / args.seconds
    best = [b for b in result.best.values() if b is not None and b > 0]
    row = {"leg": name, "pool": kind, "gpus": gpus, "seconds": args.seconds, "evaluations": len(inside),
           "evaluations_total": len(done), "run_seconds": round(elapsed, 1), "evals_per_s": round(per_s, 4),
           "evals_per_hour": round(per_s * 3600, 1), "evals_per_gpu_hour": round(per_s * 3600 / gpus, 1),
           "ok": statuses.get("ok", 0), "statuses": dict(statuses),
           "best_geomean": round(math.exp(sum(math.log(b) for b in best) / len(best)), 4) if best else None,
           "shapes": len(args.shape_list), "shapes_with_ok": len(best),
           "gpu_s_per_eval": round(gpu_s / len(done), 4) if done else None,
           "busy_fraction": round(stats.busy_fraction(), 3), "compile_s": round(stats.compile_s, 1),
           "worker_restarts": stats.restarts, "actors_replaced": getattr(stats, "actors_replaced", 0),
           "stolen": getattr(stats, "stolen", 0), "lost_in_flight": result.lost, "stop": result.reason}
    if killer is not None:
        row["faults"] = _fault_figures(killer, archive_dir, args, done, stats, evs[-1]["t"])
    geo = "-" if row["best_geomean"] is None else f"{row['best_geomean']:.3f}"
    print(f"[{name}] {len(inside)} evaluations in {args.seconds:g} s ({row['evals_per_hour']:.0f}/h, "
          f"{row['evals_per_gpu_hour']:.0f} per GPU-hour), best-speedup geomean {geo} over "
          f"{len(best)}/{len(args.shape_list)} shapes, statuses {dict(statuses)}, GPU busy {row['busy_fraction']:.0%}",
          flush=True)
    return row


def _fault_figures(killer: Any, archive_dir: Path, args: argparse.Namespace, done: list[dict], stats: Any,
                   end_t: float) -> dict[str, Any]:
    from _ray_faults import committed, fault_report

    final = committed(archive_dir, args.shape_list)
    with Archive(archive_dir, "r") as ar:
        have = set(ar.shapes())
        submitted = {(c.id, str(s)) for s in args.shape_list if s in have for c in ar.candidates(s)}
    rep = fault_report(killer.faults, killer.snapshots, final, submitted, [e["t"] for e in done],
                       list(stats.actor_events), end_t, window_s=args.recovery_window)
    rep["errors"] = killer.errors
    for f in rep["faults"]:
        print(f"[fault] {f['kind']} at +{f['t'] - done[0]['t'] if done else 0:.0f} s: replacement serving after "
              f"{f['replaced_s']} s, rate {f['rate_before']:.2f}/s before, {f['rate_after']:.2f}/s after "
              f"({'recovered' if f['recovered'] else 'not judged' if f['recovered'] is None else 'NOT recovered'})",
              flush=True)
    print(f"[fault] {len(rep['faults'])} fault(s): {rep['committed_lost']} committed record(s) lost, "
          f"{rep['unevaluated']} candidate(s) without an evaluation", flush=True)
    return rep


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Scaling of every leg against the 1-GPU leg (``ray1``; ``local1`` for local legs)."""
    out: dict[str, Any] = {"target": TARGET, "efficiency_targets": EFFICIENCY, "legs": []}
    by = {r["leg"]: r for r in rows}
    for r in rows:
        base = by.get("local1" if r["pool"] == "local" else "ray1")
        if r["gpus"] < 2 or base is None or not base["evals_per_s"] > 0:
            continue
        scaling = r["evals_per_s"] / base["evals_per_s"]
        target = EFFICIENCY.get(r["gpus"])
        entry = {"leg": r["leg"], "gpus": r["gpus"], "vs": base["leg"], "scaling": round(scaling, 3),
                 "efficiency": round(scaling / r["gpus"], 3), "target": target,
                 "target_met": None if target is None else scaling / r["gpus"] >= target}
        out["legs"].append(entry)
        if r["leg"] in ("ray2", "local2"):  # issue 10's figure, as before
            out[r["pool"]] = {"scaling": entry["scaling"], "efficiency": entry["efficiency"],
                              "target_met": scaling >= TARGET}
    return out


def write(rows: list[dict[str, Any]], summary: dict[str, Any], args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"shapes": [str(s) for s in args.shape_list], "shape_set": args.shape_set, "seconds": args.seconds,
            "warmup": args.warmup, "legs": args.leg_list, "kill_every": args.kill_every, "node_down": args.node_down,
            "recovery_window": args.recovery_window,
            "compile_workers": args.compile_workers, "ray": args.ray, "cpus": os.cpu_count(),
            "smoke_test": bool(args.worker_target), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / "ray_scaling.json").write_text(json.dumps({"meta": meta, "legs": rows, "summary": summary}, indent=2) + "\n")
    cols = ["leg", "pool", "gpus", "seconds", "evaluations", "evals_per_s", "evals_per_hour", "evals_per_gpu_hour",
            "best_geomean", "shapes_with_ok", "shapes", "ok", "gpu_s_per_eval", "busy_fraction", "compile_s",
            "worker_restarts", "actors_replaced", "stolen", "lost_in_flight", "evaluations_total", "run_seconds", "stop"]
    with open(out / "ray_scaling.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def leg_in_child(leg: str, argv: list[str], work: Path) -> dict[str, Any]:
    """Run one leg in a fresh Python process (``--leg-child``) and return its row: every leg
    gets its own Ray driver, so nothing of a leg (its cluster, threads of a pool that lost
    actors) is left to disturb the next, and a two-node cluster never meets a stale driver."""
    import subprocess

    out = work / f"{leg}.row.json"
    out.unlink(missing_ok=True)
    code = subprocess.run([sys.executable, str(Path(__file__).resolve()), *argv, "--leg-child", leg,
                           "--work", str(work)]).returncode
    if code != 0 or not out.is_file():
        raise RuntimeError(f"the leg's process exited with {code}")
    return json.loads(out.read_text())


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.leg_child:  # the child of leg_in_child: one leg, its row as JSON
        row = run_leg(args.leg_child, args, Path(args.work))
        (Path(args.work) / f"{args.leg_child}.row.json").write_text(json.dumps(row))
        return 0
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="evo-ray-scaling-"))
    for leg in args.leg_list:
        shutil.rmtree(work / leg, ignore_errors=True)
        shutil.rmtree(work / f"{leg}-cubins", ignore_errors=True)
    if any(leg_spec(leg)[0] != "local" for leg in args.leg_list):
        try:
            import ray  # noqa: F401
        except ImportError:
            print("ray_scaling: error: the Ray legs need the ray package (pip install -e '.[ray]')", file=sys.stderr)
            return 2
    rows, failed = [], []
    for leg in args.leg_list:
        try:
            row = leg_in_child(leg, argv, work)
        except Exception as exc:  # report the leg and go on to the next
            print(f"[{leg}] failed: {type(exc).__name__}: {exc}", flush=True)
            failed.append(leg)
            continue
        rows.append(row)
        faults = row.get("faults") or {}
        # a fault leg fails on a lost committed record, or a candidate left unevaluated that the
        # engine did not abandon itself (in flight when the budget's drain ran out)
        if row["evaluations"] == 0 or faults.get("committed_lost") or \
                faults.get("unevaluated", 0) > row.get("lost_in_flight", 0):
            failed.append(leg)
        write(rows, summarise(rows), args)  # after every leg: a later failure keeps the earlier figures
    summary = summarise(rows)
    write(rows, summary, args)
    for s in summary["legs"]:
        verdict = "" if s["target"] is None else \
            f"; target {s['target']:.0%} {'met' if s['target_met'] else 'MISSED'}"
        print(f"ray_scaling: {s['leg']}: {s['gpus']} GPUs give {s['scaling']:.2f}x the evaluations of 1 GPU "
              f"({s['vs']}; efficiency {s['efficiency']:.0%}{verdict})", flush=True)
    print(f"ray_scaling: wrote {Path(args.out) / 'ray_scaling.json'} and ray_scaling.csv", flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
