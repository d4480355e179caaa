"""Before/after figures of an ``evo run``: best seed vs best evolved kernel per shape.

    python bench/evo_run_bench.py ARCHIVE [--remeasure K] [--out DIR]

Reads the archive and its ``events.jsonl`` (read-only; it can sit beside a running engine's
copy) and reports, per shape:

* ``seed``: the best starting candidate (operator ``seed`` or ``transfer``: what the run began
  with), ``evolved``: the best candidate any operator made, both by the archive's median
  device-timer speedup over cuBLAS (torch.matmul, best of NN/TN, timed in the same worker);
* evaluations and their statuses, and evaluations per GPU-hour over the run's segments
  (``start``..``stop`` events; a resumed run has several), times the GPUs the pool used.

The best of many noisy measurements is biased upward (the winner's curse), so ``--remeasure K``
re-times the best seed and the best evolved kernel of every shape ``K`` times each in a fresh
``evaluators.LocalPool`` (new worker, fresh random inputs) and reports those medians too; the
headline columns are the re-measured ones when present. Writes ``evo_run_bench.csv``,
``evo_run_bench.md`` and ``evo_run_bench.png`` under ``--out`` (default: $OUT or .).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from populations import Archive, Candidate, Shape  # noqa: E402

STARTERS = ("seed", "transfer")


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def segments(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per run segment: wall seconds and evaluations between ``start`` and ``stop``."""
    segs, cur = [], None
    for ev in events:
        if ev.get("event") == "start":
            cur = {"t0": ev["t"], "t1": ev["t"], "evals": 0, "inflight": ev.get("inflight")}
            segs.append(cur)
        elif cur is not None:
            cur["t1"] = ev["t"]
            if ev.get("event") == "evaluation":
                cur["evals"] += 1
    return segs


def best_split(archive: Archive, shape: Shape) -> tuple[Optional[Any], Optional[Any]]:
    """(best starter elite, best evolved elite) at ``shape`` by median fitness."""
    seed = evolved = None
    for elite in archive.elites(shape, top=None):
        cand = elite.candidate
        if cand is None:
            continue
        if cand.operator in STARTERS:
            seed = seed or elite
        else:
            evolved = evolved or elite
        if seed and evolved:
            break
    return seed, evolved


def remeasure(cands: list[tuple[Shape, Candidate]], k: int, gpus: Optional[list[int]]) -> dict[tuple[str, str], list[float]]:
    """Speedups of each (shape, candidate) re-timed ``k`` times in a fresh pool."""
    from evaluators import LocalPool

    out: dict[tuple[str, str], list[float]] = {}
    jobs = []
    with LocalPool(gpus=gpus, compile_workers=4) as pool:
        for _ in range(k):
            for shape, cand in cands:
                one = cand if cand.shapes == (shape,) else cand.derive(shapes=(shape,))
                jobs.append((shape, cand.id, pool.submit(one)))
        for i, (shape, cid, fut) in enumerate(jobs):
            try:
                evs = fut.result(timeout=600)
            except Exception as exc:  # a lost job is reported, not fatal
                print(f"remeasure: {shape} {cid[:12]} lost: {exc}", flush=True)
                continue
            for ev in evs:
                if ev.fitness is not None:
                    out.setdefault((str(shape), cid), []).append(ev.fitness)
            if (i + 1) % 8 == 0:
                print(f"remeasure: {i + 1}/{len(jobs)}", flush=True)
    return out


def geomean(xs: list[float]) -> Optional[float]:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("archive", type=Path)
    ap.add_argument("--remeasure", type=int, default=0, metavar="K", help="re-time best seed/evolved K times each")
    ap.add_argument("--gpus", default=None, help="GPU indices for the re-measuring pool, e.g. 0")
    ap.add_argument("--gpus-used", type=int, default=1, help="GPUs the run's pool used (for evals per GPU-hour)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ".")))
    args = ap.parse_args(argv)
    if not args.archive.is_dir():
        print(f"evo_run_bench: error: no archive at {args.archive}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    archive = Archive(args.archive, mode="r")
    shapes = archive.shapes()
    segs = segments(_events(args.archive / "events.jsonl"))
    wall = sum(s["t1"] - s["t0"] for s in segs)
    n_evals = sum(s["evals"] for s in segs)
    rows: list[dict[str, Any]] = []
    to_time: list[tuple[Shape, Candidate]] = []
    for shape in shapes:
        seed, evolved = best_split(archive, shape)
        counts = {st.value: n for st, n in archive.status_counts(shape).items()}
        row = {"shape": str(shape), "flops": shape.flops, "evaluations": sum(counts.values()),
               "ok": counts.get("ok", 0), "seed_id": seed.candidate_id if seed else "",
               "seed_archive": seed.fitness if seed else None,
               "evolved_id": evolved.candidate_id if evolved else "",
               "evolved_archive": evolved.fitness if evolved else None,
               "evolved_operator": evolved.candidate.operator if evolved else "",
               "evolved_template": evolved.candidate.template if evolved else ""}
        rows.append(row)
        for e in (seed, evolved):
            if e is not None:
                to_time.append((shape, e.candidate))
    timed: dict[tuple[str, str], list[float]] = {}
    if args.remeasure > 0 and to_time:
        gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
        timed = remeasure(to_time, args.remeasure, gpus)
    for row in rows:
        for key in ("seed", "evolved"):
            vals = timed.get((row["shape"], row[f"{key}_id"]), [])
            row[f"{key}_remeasured"] = statistics.median(vals) if vals else None
            row[f"{key}_n"] = len(vals)
            row[key] = row[f"{key}_remeasured"] if vals else row[f"{key}_archive"]
        s, e = row["seed"], row["evolved"]
        row["best"] = max(x for x in (s, e) if x is not None) if (s or e) else None
        row["improved"] = bool(s and e and e > s)
    write(rows, args, wall, n_evals)
    return 0


def write(rows: list[dict[str, Any]], args: argparse.Namespace, wall: float, n_evals: int) -> None:
    cols = ["shape", "flops", "evaluations", "ok", "seed", "evolved", "best", "improved", "seed_archive",
            "evolved_archive", "seed_remeasured", "evolved_remeasured", "seed_n", "evolved_n",
            "evolved_operator", "evolved_template", "seed_id", "evolved_id"]
    with open(args.out / "evo_run_bench.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    fmt = lambda x: f"{x:.3f}x" if isinstance(x, float) else "-"  # noqa: E731
    gpu_h = wall * args.gpus_used / 3600
    lines = ["| shape | evals | ok | best seed | best evolved | best | improved | evolved by |",
             "|---|---:|---:|---:|---:|---:|:-:|---|"]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['evaluations']} | {r['ok']} | {fmt(r['seed'])} | {fmt(r['evolved'])} | "
                     f"{fmt(r['best'])} | {'yes' if r['improved'] else 'no'} | "
                     f"{r['evolved_operator']} {r['evolved_template'] or ''} |")
    gm = geomean([r["best"] for r in rows if r["best"]])
    gms = geomean([r["seed"] for r in rows if r["seed"]])
    lines += ["", f"shapes: {len(rows)}; improved on the best seed: {sum(r['improved'] for r in rows)}/{len(rows)}",
              f"geomean best seed: {fmt(gms)}; geomean best (seed or evolved): {fmt(gm)}",
              f"evaluations in run segments: {n_evals} in {wall:.0f} s wall on {args.gpus_used} GPU(s): "
              f"{n_evals / gpu_h if gpu_h else 0:.0f} evaluations per GPU-hour",
              f"figures: {'re-measured medians of ' + str(args.remeasure) + ' fresh timings' if args.remeasure else 'archive medians'}"]
    text = "\n".join(lines)
    (args.out / "evo_run_bench.md").write_text(text + "\n")
    print(text, flush=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(10, 4.5))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["seed"] or 0 for r in rows], 0.4, label="best seed")
    ax.bar([x + 0.2 for x in xs], [r["evolved"] or 0 for r in rows], 0.4, label="best evolved")
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xticks(list(xs), [r["shape"].split(":")[0] for r in rows], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("speedup vs cuBLAS (device time)")
    ax.set_title("evo run: best seed vs best evolved kernel per shape")
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.out / "evo_run_bench.png", dpi=110)


if __name__ == "__main__":
    sys.exit(main())
