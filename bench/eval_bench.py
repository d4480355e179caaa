"""Evaluator throughput and repeatability on this machine's GPUs (issue 4).

    python bench/eval_bench.py [--n 24] [--starts 5] [--compile-workers 8] [--out DIR]

1. Throughput: a batch of template candidates (``populations.load_templates()``, knob sets
   drawn with ``Template.sample``; the built-in naive kernels when no template applies) at
   4096x4096x4096 and at 64x128x64, through one ``LocalPool``: candidates per minute, the
   summed compile / correctness / timing seconds, the workers' busy share of the GPU phase
   (``PoolStats.busy_fraction``) and NVML's GPU utilisation sampled every 50 ms.
   Candidates are submitted one by one with the engine's elite threshold (the ``--elites``-th best
   speedup so far x 0.95, once that many are ``ok``), so the memoisation pass runs as in a run;
   per-step seconds (``provenance["phases"]``) are summed, and memo passes run/skipped counted.
2. Repeatability: one kernel timed in ``--starts`` separate worker starts (a fresh pool each),
   each start timing ``--rotations`` freshly allocated rotations and reporting their median; the
   spread of the per-start medians, (max - min) / median, should stay under 2%, and the spread
   inside each start says how much of it is where the buffers landed.

Prints a table last and writes ``eval_bench.json`` under ``--out`` (default: $OUT or .).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evaluators import LocalPool, PoolStats  # noqa: E402
from evaluators._builtin_kernels import naive_candidate  # noqa: E402
from populations import Candidate, Shape, Status  # noqa: E402


def template_batch(shape: Shape, n: int, arch: int, seed: int) -> list[Candidate]:
    """``n`` template candidates for ``shape`` (round-robin over applicable templates)."""
    out: list[Candidate] = []
    try:
        from populations import load_templates

        tpls = [t for _, t in sorted(load_templates(errors="warn").items()) if t.applicable(shape, arch)]
    except Exception as exc:
        print(f"templates unavailable ({exc!r}); using built-in kernels")
        tpls = []
    rng = random.Random(seed)
    pools = {t.name: t.heuristic(shape) + t.sample(rng, shape, n) for t in tpls}
    while len(out) < n and any(pools.values()):
        for t in tpls:
            if pools[t.name] and len(out) < n:
                knobs = pools[t.name].pop(0)
                try:
                    c = t.candidate(knobs, shape)
                except Exception as exc:
                    print(f"render failed {t.name} {knobs}: {exc!r}")
                    continue
                if c.id not in {x.id for x in out}:
                    out.append(c)
    tiles = [8, 16, 32]
    i = 0
    while len(out) < n:  # fallback: the built-in naive kernel at several tile sizes (distinct ids)
        out.append(naive_candidate((shape,), tile=tiles[i % 3]).derive(meta={"fill": i}))
        i += 1
    return out


class UtilSampler(threading.Thread):
    """NVML GPU utilisation every 50 ms (percent of time a kernel was running)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[int] = []
        self.stop = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:
            self.nvml = None

    def run(self) -> None:
        while self.nvml and not self.stop.wait(0.05):
            self.samples.append(statistics.mean(self.nvml.nvmlDeviceGetUtilizationRates(h).gpu for h in self.handles))


def elite_threshold(speedups: list[float], elites: int, margin: float = 0.95) -> float | None:
    """The engine's rule (evo._engine.Engine._elite_threshold): the ``elites``-th best x margin."""
    if elites <= 0 or len(speedups) < elites:
        return None
    return sorted(speedups, reverse=True)[elites - 1] * margin


def throughput(pool: LocalPool, cands: list[Candidate], elites: int = 8) -> dict[str, Any]:
    pool.stats = PoolStats()
    sampler = UtilSampler()
    sampler.start()
    t0 = time.monotonic()
    done: list[float] = []
    lock = threading.Lock()

    def seen(fut: Any) -> None:
        try:
            for e in fut.result():
                if e.status is Status.OK and e.speedup:
                    with lock:
                        done.append(e.speedup)
        except Exception:
            pass
    futures = []
    for c in cands:
        with lock:
            thr = elite_threshold(done, elites)
        fut = pool.submit(c, elite_threshold=thr)
        fut.add_done_callback(seen)
        futures.append(fut)
    evals = [e for f in futures for e in f.result()]
    wall = time.monotonic() - t0
    sampler.stop.set()
    ok = [e for e in evals if e.status is Status.OK]
    speedups = sorted(e.speedup for e in ok if e.speedup)
    phases: dict[str, float] = {}
    for e in evals:
        for k, v in (e.provenance.get("phases") or {}).items():
            phases[k] = phases.get(k, 0.0) + float(v)
    memo = Counter(str(e.provenance.get("memo_check") or "none").split(":")[0] for e in evals)
    return {
        "candidates": len(cands), "wall_s": wall, "per_minute": 60 * len(cands) / wall,
        "statuses": dict(Counter(e.status.value for e in evals)),
        "compile_s": sum(e.compile_s for e in evals), "correctness_s": sum(e.correctness_s for e in evals),
        "timing_s": sum(e.timing_s for e in evals), "busy_fraction": pool.stats.busy_fraction(),
        "nvml_util_mean": statistics.mean(sampler.samples) if sampler.samples else None,
        "best_speedup": speedups[-1] if speedups else None,
        "median_speedup": statistics.median(speedups) if speedups else None,
        "phases_s": {k: round(v, 3) for k, v in sorted(phases.items())}, "memo_pass": dict(memo),
        "messages": sorted({e.message[:160] for e in evals if e.status is not Status.OK})[:8],
    }


def repeatability(cand: Candidate, starts: int, workers: int, rotations: int = 1,
                  worker_options: dict | None = None) -> dict[str, Any]:
    runs = []
    for _ in range(starts):
        with LocalPool(compile_workers=workers, timers=("device",), job_options={"rotations": rotations},
                       worker_options=worker_options) as pool:
            e = pool.evaluate([cand])[0]
        if e.status is not Status.OK:
            return {"error": f"{e.status}: {e.message[:200]}"}
        t = e.timers["device"]
        runs.append({"median_us": t.median * 1e6, "lo_us": t.lo * 1e6, "hi_us": t.hi * 1e6, "samples": t.samples,
                     "baseline_us": t.baseline_median * 1e6, "speedup": t.speedup,
                     "sm_clock_mhz": e.provenance.get("sm_clock_mhz"),
                     "rotations_us": [round(r["median"] * 1e6, 2) for r in e.provenance.get("device_rotations") or ()]})
    meds = [r["median_us"] for r in runs]
    inside = [(max(r["rotations_us"]) - min(r["rotations_us"])) / statistics.median(r["rotations_us"])
              for r in runs if len(r["rotations_us"]) > 1]
    sps = [r["speedup"] for r in runs]
    return {"candidate": cand.template or "naive", "knobs": dict(cand.knobs or {}), "shape": str(cand.shapes[0]),
            "medians_us": meds, "spread": (max(meds) - min(meds)) / statistics.median(meds),
            "speedup_spread": (max(sps) - min(sps)) / statistics.median(sps), "runs": runs,
            "rotations": rotations, "spread_inside_start_max": max(inside) if inside else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=24, help="candidates per shape")
    ap.add_argument("--starts", type=int, default=5)
    ap.add_argument("--compile-workers", type=int, default=min(12, os.cpu_count() or 4))
    ap.add_argument("--shapes", default="4096x4096x4096:TN,64x128x64:TN")
    ap.add_argument("--rotations", type=int, default=3, help="re-allocated rotations per start (repeatability)")
    ap.add_argument("--elites", type=int, default=8, help="elite-set size for the memo-pass threshold (0: always run it)")
    ap.add_argument("--skip-repeatability", action="store_true")
    ap.add_argument("--rep-template", default=None,
                    help="template of the repeatability kernel (its heuristic pick; default: the first applicable)")
    ap.add_argument("--buffers", default=None, choices=["vmm", "torch"],
                    help="worker buffers (default: the worker's, EVO_EVAL_BUFFERS)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "args": vars(args)}
    wopts = {"buffers": args.buffers} if args.buffers else None
    with LocalPool(compile_workers=args.compile_workers, worker_options=wopts) as pool:
        arch = int(pool.arch[3:5])
        warm = pool.evaluate([naive_candidate((Shape.parse("64x64x64"),))])[0]
        report["warmup"] = {"status": warm.status.value, "message": warm.message[:200]}
        report["provenance"] = {k: v for k, v in warm.provenance.items() if k != "checks"}
        for text in args.shapes.split(","):
            shape = Shape.parse(text)
            cands = template_batch(shape, args.n, arch, seed=1)
            res = throughput(pool, cands, args.elites)
            report[str(shape)] = res
            print(json.dumps({str(shape): res}, indent=1, default=str), flush=True)
        report["buffers"] = pool.supervisors[0].info.get("buffers")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "eval_bench.json"), "w") as f:  # throughput kept if repeatability dies
        json.dump(report, f, indent=1, default=str)
    if not args.skip_repeatability:
        big = Shape.parse(args.shapes.split(",")[0])
        rep_cand = template_batch(big, 1, arch, seed=1)[0]
        if args.rep_template:
            from populations import load_templates

            tpl = load_templates()[args.rep_template]
            rep_cand = tpl.candidate(tpl.heuristic(big)[0], big)
        report["repeatability"] = repeatability(rep_cand, args.starts, args.compile_workers, args.rotations, wopts)
    with open(os.path.join(args.out, "eval_bench.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"\n{'shape':<24}{'cands':>6}{'per min':>9}{'compile s':>10}{'check s':>9}{'time s':>8}{'busy':>6}{'nvml%':>7}  statuses")
    for text in args.shapes.split(","):
        r = report[str(Shape.parse(text))]
        print(f"{text:<24}{r['candidates']:>6}{r['per_minute']:>9.1f}{r['compile_s']:>10.1f}{r['correctness_s']:>9.1f}"
              f"{r['timing_s']:>8.1f}{r['busy_fraction']:>6.2f}{(r['nvml_util_mean'] or 0):>7.0f}  {r['statuses']}")
        print(f"  phases {r['phases_s']}  memo {r['memo_pass']}")
    print("buffers:", json.dumps(report.get("buffers"), default=str))
    print("repeatability:", json.dumps(report.get("repeatability"), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
