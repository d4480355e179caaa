"""Split-K check and sweep: correctness and device-time speedup of split-K candidates (issue 3).

    python bench/splitk_sweep.py [--shapes 64x64x16384 ...] [--budget-s 150] [--out DIR]
                               [--compile-only]

For every shape, each applicable template contributes its heuristic picks (``evo seed``'s first
picks) plus the first split-K pick re-rendered at every other SPLIT_K value of its domain, so one
run shows which split factor wins where. Everything goes through one ``evaluators.LocalPool``
(correctness against the reference on NaN-poisoned outputs, then the ``device`` timer against
torch.matmul). Writes ``splitk.csv`` (one row per candidate) and prints the best per shape.
Exits 1 when any candidate is ``incorrect`` or fails at run time (a split-K bug), 2 on bad input.
``--compile-only`` compiles every candidate here (NVRTC, sm_90a) without a GPU.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from populations import Candidate, Shape, ShapeError, load_templates  # noqa: E402

SHAPES = ["64x64x16384", "128x128x8192", "256x256x4096", "1024x256x16384", "129x257x520", "77x4096x4096:NN",
          "12288x64x12288", "128x128x1024", "64x1024x1024", "256x512x8192", "256x256x512", "64x512x512",
          "1024x1024x1024"]
PICKS = 2
BAD = {"incorrect", "runtime_error", "timeout", "compile_error", "rejected"}


def candidates(shape: Shape, templates: dict[str, Any], arch: str) -> list[Candidate]:
    """The first ``PICKS`` heuristic picks, then the first split pick (or the first pick) at the
    other valid SPLIT_K values within a factor of 2 of its own (2, 4, 8 for an unsplit pick)."""
    out: dict[str, Candidate] = {}
    for name, t in sorted(templates.items()):
        if not t.applicable(shape, arch):
            continue
        picks = t.heuristic(shape, arch)[:PICKS]
        sets = list(picks)
        split = next((p for p in picks if p.get("SPLIT_K", 1) > 1), picks[0] if picks else None)
        if split is not None:
            own = split["SPLIT_K"]
            lo, hi = (own / 2, own * 2) if own > 1 else (2, 8)
            for s in (v for v in t.space.knobs["SPLIT_K"].values if lo <= v <= hi and v > 1):
                k = dict(split, SPLIT_K=s)
                if not t.check(k, shape, arch):
                    sets.append(k)
        for i, knobs in enumerate(sets):
            c = t.candidate(knobs, shape, meta={"seed": "heuristic" if i < len(picks) else "split-sweep"})
            out.setdefault(c.id, c)
    return list(out.values())


def compile_only(jobs: list[tuple[Shape, list[Candidate]]], arch: str) -> int:
    from evaluators import CompilePool

    with CompilePool(workers=min(8, os.cpu_count() or 2), use_cache=False) as pool:
        futs = [(s, c, pool.submit(c, arch)) for s, cands in jobs for c in cands]
        bad = 0
        for s, c, f in futs:
            r = f.result()
            if not r.ok:
                bad += 1
                print(f"FAIL {s} {c.template} {json.dumps(c.knobs)}: {r.message[-800:]}", flush=True)
    print(f"compiled {len(futs)} candidates, {bad} failed")
    return 1 if bad else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--budget-s", type=float, default=150.0, help="stop submitting new shapes after this")
    p.add_argument("--compile-workers", type=int, default=min(14, os.cpu_count() or 2))
    p.add_argument("--compile-only", action="store_true", help="NVRTC compiles here, no GPU")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()
    try:
        shapes = [Shape.parse(s) for s in args.shapes]
    except ShapeError as exc:
        print(f"splitk_sweep: {exc}", file=sys.stderr)
        return 2
    templates = load_templates()
    if args.compile_only:
        return compile_only([(s, candidates(s, templates, "sm_90a")) for s in shapes], "sm_90a")

    from evaluators import LocalPool

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    fh = open(out / "splitk.csv", "w", newline="")  # written shape by shape: a timeout keeps what finished
    writer: Any = None
    with fh, LocalPool(compile_workers=args.compile_workers, timers=("device",), log_dir=str(out)) as pool:
        pending = []
        for shape in shapes:
            if time.monotonic() - t0 > args.budget_s:
                print(f"not run (budget): {shape}", flush=True)
                continue
            cands = candidates(shape, templates, pool.arch)
            pending.append((shape, cands, [pool.submit(c) for c in cands]))
        for shape, cands, futs in pending:
            best: dict[str, tuple[float, dict]] = {}
            for c, f in zip(cands, futs):
                for e in f.result():
                    t = e.timers.get("device")
                    rows.append({"shape": str(shape), "template": c.template, "split_k": c.knobs.get("SPLIT_K", 1),
                                 "origin": c.meta.get("seed", ""), "status": e.status.value, "speedup": e.fitness,
                                 "us": t.median * 1e6 if t else None,
                                 "cublas_us": t.baseline_median * 1e6 if t else None, "max_error": e.max_error,
                                 "knobs": json.dumps(c.knobs, sort_keys=True), "message": e.message[:300]})
                    if e.fitness is not None and e.fitness > best.get(c.template, (0.0, {}))[0]:
                        best[c.template] = (e.fitness, c.knobs)
            if writer is None and rows:
                writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
                writer.writeheader()
            if writer is not None:
                writer.writerows(r for r in rows if r["shape"] == str(shape))
                fh.flush()
            line = "  ".join(f"{n} {v[0]:.3f}x(S={v[1].get('SPLIT_K', 1)})" for n, v in sorted(best.items()))
            print(f"{str(shape):>22} {len(cands):3d} cand  {line}", flush=True)
    bad = [r for r in rows if r["status"] in BAD]
    by_status: dict[str, int] = defaultdict(int)
    for r in rows:
        by_status[r["status"]] += 1
    print(f"{len(rows)} evaluations {dict(by_status)} in {time.monotonic() - t0:.0f} s")
    for r in bad:
        print(f"BAD {r['shape']} {r['template']} S={r['split_k']} {r['status']}: {r['message']}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
