"""Ray pool scaling: evaluations per GPU-hour with 1 GPU and with 2 GPUs on one shape set (issue 10).

    python bench/ray_scaling.py [--seconds 100] [--warmup 10] [--shapes 2048x2048x2048,4096x4096x4096]
                                [--legs ray1,ray2] [--ray local|auto|HOST:6379] [--out DIR]

Each leg runs the real engine (knob operators: mutation, crossover, random; no Optuna needed) on
a fresh archive once its pool is up (GPU actors started, health probes passed: start-up is not
counted) for ``--warmup`` + ``--seconds`` of wall time, and counts the evaluations that finished
in the last ``--seconds`` (``evaluation`` events of the run's ``events.jsonl``): steady state,
not the pipeline filling. Legs: ``ray1``/``ray2`` are
RayPool with 1/2 GPU actors on one Ray cluster; ``local1``/``local2`` the same on LocalPool
(GPUs 0 / 0,1) for comparison. Each leg has its own archive and cubin cache, so no leg profits
from an earlier leg's compiles.

Scaling = (evaluations/s with 2 GPUs) / (evaluations/s with 1 GPU); the target is >= 1.8x. The
harness keeps timing buffers for its last two shapes, so with more than two shapes the
two-actor leg (two shapes per actor, by shape affinity) also saves buffer set-ups the one-GPU
leg pays for: the default shape set has two shapes so that the ratio measures parallelism only.

Prints the engine's progress lines and one line per leg, and writes ``ray_scaling.json`` and
``ray_scaling.csv`` under ``--out`` (default: $OUT or .). Exits 1 when a leg fails or
evaluates nothing, 2 on bad input; a missed target is reported, not an error.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from populations import Archive, Shape, ShapeError, load_templates  # noqa: E402

TARGET = 1.8
LEGS = {"ray1": ("ray", 1), "ray2": ("ray", 2), "local1": ("local", 1), "local2": ("local", 2)}


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=100.0, help="measured wall time per leg (default 100)")
    ap.add_argument("--warmup", type=float, default=10.0,
                    help="seconds each leg runs before its measured window opens (pipeline fill; default 10)")
    ap.add_argument("--shapes", default="2048x2048x2048,4096x4096x4096", help="comma-separated shapes")
    ap.add_argument("--legs", default="ray1,ray2", help=f"comma-separated, from {','.join(LEGS)}")
    ap.add_argument("--ray", default="local", help="local (a fresh cluster here), auto, or HOST:PORT")
    ap.add_argument("--compile-workers", type=int, default=max(2, min(12, (os.cpu_count() or 4) - 4)),
                    help="compiles in flight, the same in every leg (default: CPUs - 4, at most 12)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", default=None, help="folder for the archives (default: a temp folder, removed)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--num-gpus", type=int, default=None,
                    help="GPUs a cluster started here declares (default: what Ray detects)")
    # CPU smoke test only: the GPU handler test double (tests/fake_gpu_worker.py), no measurement.
    ap.add_argument("--worker-target", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    try:
        args.shape_list = [Shape.parse(s) for s in args.shapes.split(",") if s.strip()]
    except ShapeError as exc:
        ap.error(f"--shapes: {exc}")
    args.leg_list = [leg.strip() for leg in args.legs.split(",") if leg.strip()]
    bad = [leg for leg in args.leg_list if leg not in LEGS]
    if bad or not args.leg_list:
        ap.error(f"--legs: unknown {bad}; choose from {', '.join(LEGS)}")
    if not args.seconds > 0 or args.warmup < 0 or not args.shape_list:
        ap.error("--seconds must be positive, --warmup not negative, and --shapes must name a shape")
    return args


def make_pool(kind: str, gpus: int, args: argparse.Namespace, cache: str) -> Any:
    from evaluators import LocalPool, RayPool

    extra: dict[str, Any] = {}
    if args.worker_target:
        extra = {"target": args.worker_target, "arch": "sm_90a",
                 "deadlines": {"startup": 60.0, "probe": 20.0, "load": 10.0, "correctness": 10.0, "timing": 10.0}}
    if kind == "ray":
        return RayPool(gpus=gpus, compile_workers=args.compile_workers, address=args.ray, cache_dir=cache, **extra)
    return LocalPool(gpus=list(range(gpus)), compile_workers=args.compile_workers, cache_dir=cache, **extra)


def run_leg(name: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One leg: a pool, the engine for ``args.seconds`` once the pool is up; the leg's figures."""
    from evo._orchestrate import expand_operators, make_operators
    from evo._config import merge
    from evo._engine import Engine
    from evo._progress import EVENTS_FILE, EventLog, Progress, read_events

    kind, gpus = LEGS[name]
    archive_dir, cache = work / name, str(work / f"{name}-cubins")
    cfg = merge({}, {"shapes": [str(s) for s in args.shape_list], "archive": str(archive_dir), "operators": "knob",
                     "seed": args.seed, "budget": args.warmup + args.seconds, "progress": "plain",
                     "pool": {"compile_workers": args.compile_workers, "gpus": list(range(gpus))}})
    cfg.operators = expand_operators(cfg.operators)
    print(f"[{name}] starting the {kind} pool with {gpus} GPU(s), {args.compile_workers} compile workers", flush=True)
    t_pool = time.monotonic()
    pool = make_pool(kind, gpus, args, cache)
    try:
        if kind == "ray":
            if not pool.wait_ready(timeout=600):
                raise RuntimeError(f"not every GPU actor started: {pool.stats}")
            where = sorted(",".join(w["ray_gpu_ids"]) for w in pool.placement().values())
            print(f"[{name}] actors up on GPU(s) {where} after {time.monotonic() - t_pool:.1f} s", flush=True)
        else:
            _ = pool.arch  # waits until the first worker is up; then the others
            while any(not sup.info for sup in pool.supervisors) and time.monotonic() - t_pool < 600:
                time.sleep(0.1)
            print(f"[{name}] workers up after {time.monotonic() - t_pool:.1f} s", flush=True)
        started = time.monotonic()
        with Archive(archive_dir, "w") as archive:
            events = EventLog(archive_dir / EVENTS_FILE)
            engine = Engine(cfg, archive, pool, make_operators(cfg.operators), load_templates(errors="warn"),
                            events=events, progress=Progress(cfg.shapes, gpus, "plain", 10.0))
            result = engine.run()
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
    row = {"leg": name, "pool": kind, "gpus": gpus, "seconds": args.seconds, "evaluations": len(inside),
           "evaluations_total": len(done), "run_seconds": round(elapsed, 1), "evals_per_s": round(per_s, 4),
           "evals_per_gpu_hour": round(per_s * 3600 / gpus, 1), "ok": statuses.get("ok", 0),
           "statuses": dict(statuses), "gpu_s_per_eval": round(gpu_s / len(done), 4) if done else None,
           "busy_fraction": round(stats.busy_fraction(), 3), "compile_s": round(stats.compile_s, 1),
           "worker_restarts": stats.restarts, "actors_replaced": getattr(stats, "actors_replaced", 0),
           "stop": result.reason, "best": result.best}
    print(f"[{name}] {len(inside)} evaluations in {args.seconds:g} s ({per_s:.2f}/s, "
          f"{row['evals_per_gpu_hour']:.0f} per GPU-hour), statuses {dict(statuses)}, "
          f"GPU busy {row['busy_fraction']:.0%}", flush=True)
    return row


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"target": TARGET}
    by = {r["leg"]: r for r in rows}
    for kind in ("ray", "local"):
        one, two = by.get(f"{kind}1"), by.get(f"{kind}2")
        if one and two and one["evals_per_s"] > 0:
            scaling = two["evals_per_s"] / one["evals_per_s"]
            out[kind] = {"scaling": round(scaling, 3), "efficiency": round(scaling / 2, 3), "target_met": scaling >= TARGET}
    return out


def write(rows: list[dict[str, Any]], summary: dict[str, Any], args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"shapes": [str(s) for s in args.shape_list], "seconds": args.seconds, "warmup": args.warmup,
            "legs": args.leg_list,
            "compile_workers": args.compile_workers, "ray": args.ray, "cpus": os.cpu_count(),
            "smoke_test": bool(args.worker_target), "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (out / "ray_scaling.json").write_text(json.dumps({"meta": meta, "legs": rows, "summary": summary}, indent=2) + "\n")
    cols = ["leg", "pool", "gpus", "seconds", "evaluations", "evals_per_s", "evals_per_gpu_hour", "ok",
            "gpu_s_per_eval", "busy_fraction", "compile_s", "worker_restarts", "actors_replaced", "evaluations_total",
            "run_seconds", "stop"]
    with open(out / "ray_scaling.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="evo-ray-scaling-"))
    for leg in args.leg_list:
        shutil.rmtree(work / leg, ignore_errors=True)
        shutil.rmtree(work / f"{leg}-cubins", ignore_errors=True)
    if any(LEGS[leg][0] == "ray" for leg in args.leg_list):
        from evaluators import RayUnavailable, connect_ray

        init: dict[str, Any] = {"include_dashboard": False} if args.ray == "local" else {}
        if args.num_gpus is not None and args.ray == "local":
            init["num_gpus"] = args.num_gpus
        if args.worker_target:  # the test double's module lives in tests/
            root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            init["runtime_env"] = {"env_vars": {"PYTHONPATH": os.pathsep.join([root, os.path.join(root, "tests")])}}
        try:
            ray = connect_ray(args.ray, **init)
        except RayUnavailable as exc:
            print(f"ray_scaling: error: {exc}", file=sys.stderr)
            return 2
        have = int(ray.cluster_resources().get("GPU", 0))
        need = max(LEGS[leg][1] for leg in args.leg_list if LEGS[leg][0] == "ray")
        print(f"ray_scaling: Ray cluster with {have} GPU(s), {int(ray.cluster_resources().get('CPU', 0))} CPU(s)",
              flush=True)
        if have < need:
            print(f"ray_scaling: error: the legs need {need} GPUs, the cluster has {have}", file=sys.stderr)
            return 2
    rows, failed = [], []
    for leg in args.leg_list:
        try:
            row = run_leg(leg, args, work)
        except Exception as exc:  # report the leg and go on to the next
            print(f"[{leg}] failed: {type(exc).__name__}: {exc}", flush=True)
            failed.append(leg)
            continue
        rows.append(row)
        if row["evaluations"] == 0:
            failed.append(leg)
        write(rows, summarise(rows), args)  # after every leg: a later failure keeps the earlier figures
    summary = summarise(rows)
    write(rows, summary, args)
    for kind in ("ray", "local"):
        if kind in summary:
            s = summary[kind]
            print(f"ray_scaling: {kind}: 2 GPUs give {s['scaling']:.2f}x the evaluations of 1 GPU "
                  f"(efficiency {s['efficiency']:.0%}; target {TARGET}x {'met' if s['target_met'] else 'MISSED'})",
                  flush=True)
    print(f"ray_scaling: wrote {Path(args.out) / 'ray_scaling.json'} and ray_scaling.csv", flush=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
