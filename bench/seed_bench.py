"""Best seed per shape vs torch.matmul in GPU time, over a stratified sample of the 1000-shape grid.

    python bench/seed_bench.py [--grid configs.csv] [--n 100] [--order flops|interleave]
                               [--picks 2] [--budget-s 300] [--out DIR] [--archive DIR]
    python bench/seed_bench.py --list [--n 100]          # the sample, one shape a line (no GPU)
    python bench/seed_bench.py --compile-only [--n 100]  # compile every seed with NVRTC (no GPU)

The grid is CUDA-L2's (M, N, K in {64 ... 16384}, TN layout, f32 contract). The sample takes
the ten largest shapes by FLOPs, then spreads the rest evenly over FLOP decades (a fixed seed),
so every size class is represented. For every shape, each applicable template contributes its
first ``--picks`` heuristic knob sets (``evo seed``'s first picks, before any evolution); all go
through one ``evaluators.LocalPool`` with the ``device`` timer (CUDA-graph replays over rotating
buffers larger than 2x L2, paired with torch.matmul best of NN/TN in the same worker). The
shape's figure is its best ``ok`` unflagged candidate.

Prints the summary last, writes ``seed_bench.csv``, ``seed_bench.json`` and ``seed_bench.png``
(speedup vs FLOPs) under ``--out`` (default: $OUT or .). Shapes not reached inside
``--budget-s`` are listed as not run, not dropped silently; ``--order interleave`` submits
round-robin over FLOP decades (largest first), so a cut run still spans the sizes and reaches
the largest shapes. With ``--archive DIR`` every candidate and its evaluations are also recorded
in an evo archive (created, or resumed: a seed already evaluated at its shape there is not run
again, its archived evaluations count), so the seeds can be exported (``evo export``), measured
against the peers (``bench/peers_bench.py``) or evolved further (``evo run`` on a copy).

``--compile-only`` is the CPU check of a device plan: every seed of the sample goes through the
evaluator's compiler (static scan, NVRTC, ptxas resource policy) for ``--arch``; exit 1 when
any fails.
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import os
import random
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evaluators import LocalPool  # noqa: E402
from populations import Archive, ArchiveError, Candidate, Shape, load_templates  # noqa: E402

#: CUDA-L2's grid (shared/anchors/cuda-l2/configs.csv holds exactly these 1000 shapes).
GRID_SIZES = (64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384)


def read_grid(path: Path | None) -> list[Shape]:
    if path is None:
        return [Shape(m, n, k) for m in GRID_SIZES for n in GRID_SIZES for k in GRID_SIZES]
    with open(path, newline="") as fh:
        return [Shape(int(r["M"]), int(r["N"]), int(r["K"])) for r in csv.DictReader(fh)]


def stratified(grid: list[Shape], n: int, seed: int) -> list[Shape]:
    """The ten largest by FLOPs plus an even spread over FLOP decades, ``n`` in all."""
    by_flops = sorted(grid, key=lambda s: (s.flops, s.m, s.n, s.k))
    largest = by_flops[-10:]
    rest = by_flops[:-10]
    decades: dict[int, list[Shape]] = defaultdict(list)
    for s in rest:
        decades[int(math.log10(s.flops))].append(s)
    rng = random.Random(seed)
    want = n - len(largest)
    keys = sorted(decades)
    picked: list[Shape] = []
    for i, d in enumerate(keys):  # share out evenly, remainder to the first decades
        k = want // len(keys) + (1 if i < want % len(keys) else 0)
        picked += rng.sample(decades[d], min(k, len(decades[d])))
    leftover = [s for s in rest if s not in set(picked)]  # small decades could not fill their share
    picked += rng.sample(leftover, min(len(leftover), max(0, want - len(picked))))
    return sorted(picked + largest, key=lambda s: s.flops)


def interleave(shapes: list[Shape]) -> list[Shape]:
    """Round-robin over FLOP decades, the largest decade first and each decade largest first: a
    budget cut then drops shapes of every size evenly instead of all the largest ones."""
    by: dict[int, list[Shape]] = defaultdict(list)
    for s in shapes:
        by[len(str(s.flops))].append(s)
    queues = [sorted(by[d], key=lambda s: (-s.flops, str(s))) for d in sorted(by, reverse=True)]
    out: list[Shape] = []
    while any(queues):
        for q in queues:
            if q:
                out.append(q.pop(0))
    return out


def seeds_for(shape: Shape, templates: dict[str, Any], arch: str, picks: int) -> list[Candidate]:
    out: dict[str, Candidate] = {}
    for name, t in sorted(templates.items()):
        if not t.applicable(shape, arch):
            continue
        for knobs in t.heuristic(shape)[:picks]:
            c = t.candidate(knobs, shape)
            out.setdefault(c.id, c)
    return list(out.values())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--grid", type=Path, default=None, help="a configs.csv (M,N,K columns); default: the 1000-shape grid")
    p.add_argument("--n", type=int, default=100)
    p.add_argument("--picks", type=int, default=2, help="heuristic knob sets per template and shape")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--largest", action="store_true", help="only the ten largest shapes of the sample")
    p.add_argument("--order", choices=("flops", "interleave"), default="flops",
                   help="submission order: by FLOPs (smallest first), or round-robin over FLOP decades")
    p.add_argument("--list", action="store_true", help="print the sampled shapes, one a line, and exit (no GPU)")
    p.add_argument("--compile-only", action="store_true",
                   help="compile every seed candidate (NVRTC, CPU only), report failures, exit (no GPU)")
    p.add_argument("--arch", default="sm_90a", help="target for --compile-only (default sm_90a)")
    p.add_argument("--budget-s", type=float, default=300.0, help="stop submitting new shapes after this")
    p.add_argument("--compile-workers", type=int, default=min(14, os.cpu_count() or 2))
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--archive", type=Path, default=None,
                   help="also record every candidate and evaluation in this evo archive (created or resumed)")
    args = p.parse_args()
    if args.grid is not None and not args.grid.exists():
        print(f"seed_bench: grid file {args.grid} not found", file=sys.stderr)
        return 2
    shapes = stratified(read_grid(args.grid), args.n, args.seed)
    if args.largest:
        shapes = shapes[-10:]
    if args.list:
        print("\n".join(str(s) for s in shapes))
        return 0
    if args.compile_only:
        return compile_only(shapes, args.picks, args.arch, args.compile_workers)
    archive = None
    if args.archive is not None:
        try:
            archive = Archive(args.archive, "w")
        except (ArchiveError, OSError) as exc:
            print(f"seed_bench: cannot open archive {args.archive}: {exc}", file=sys.stderr)
            return 2
    if args.order == "interleave":
        shapes = interleave(shapes)
    templates = load_templates()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows: list[dict[str, Any]] = []
    not_run: list[str] = []
    with LocalPool(compile_workers=args.compile_workers, timers=("device",), log_dir=str(out)) as pool:
        arch = pool.arch
        pending = []
        for shape in shapes:  # submit shape by shape so the budget cut leaves whole shapes
            if time.monotonic() - t0 > args.budget_s:
                not_run.append(str(shape))
                continue
            cands = seeds_for(shape, templates, arch, args.picks)
            known = archived(archive, shape)
            pending.append((shape, cands, [known[c.id] if c.id in known else pool.submit(c) for c in cands]))
        for n_done, (shape, cands, futures) in enumerate(pending, 1):
            best, best_c, statuses = None, None, defaultdict(int)
            baseline = None
            for c, f in zip(cands, futures):
                reused = isinstance(f, list)
                evals = f if reused else f.result()
                if archive is not None and not reused:
                    archive.record(c, evals)
                for e in evals:
                    statuses[e.status.value] += 1
                    t = e.timers.get("device")
                    if t is not None:
                        baseline = t.baseline_median
                    if e.fitness is not None and (best is None or e.fitness > best):
                        best, best_c = e.fitness, c
            rows.append({
                "M": shape.m, "N": shape.n, "K": shape.k, "flops": shape.flops,
                "candidates": len(cands), "best_speedup": best,
                "best_template": best_c.template if best_c else "", "best_knobs": json.dumps(best_c.knobs) if best_c else "",
                "cublas_us": baseline * 1e6 if baseline else None,
                "cublas_tflops": shape.flops / baseline / 1e12 if baseline else None,
                "statuses": json.dumps(dict(statuses)),
            })
            if archive is not None:
                archive.commit()  # durable shape by shape: a killed run keeps what it measured
            print(f"{n_done:3d}/{len(shapes)} {str(shape):>26} {len(cands):2d} cand  best {best if best else float('nan'):.3f}x"
                  f"  {best_c.template if best_c else '-':>12}  {dict(statuses)}  [{time.monotonic() - t0:.0f}s]",
                  flush=True)
        stats = pool.stats
    if archive is not None:
        archive.close()
    wall = time.monotonic() - t0
    rows.sort(key=lambda r: (r["flops"], r["M"], r["N"], r["K"]))
    with open(out / "seed_bench.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else ["M"])
        w.writeheader()
        w.writerows(rows)
    summary = summarize(rows, not_run, wall, stats.busy_fraction())
    (out / "seed_bench.json").write_text(json.dumps({"summary": summary, "rows": rows}, indent=1))
    plot(rows, out / "seed_bench.png")
    print(json.dumps(summary, indent=1))
    return 0


def archived(archive: Archive | None, shape: Shape) -> dict[str, list[Any]]:
    """The archive's evaluations at ``shape`` by candidate id (a resumed seed bench reuses them)."""
    if archive is None or shape not in set(archive.shapes()):
        return {}
    out: dict[str, list[Any]] = defaultdict(list)
    for e in archive.evaluations(shape):
        out[e.candidate_id].append(e)
    return dict(out)


def compile_only(shapes: list[Shape], picks: int, arch: str, workers: int) -> int:
    """Compile every seed of ``shapes`` for ``arch`` (the evaluator's compiler, no GPU); 1 if any fails."""
    from concurrent.futures import ThreadPoolExecutor

    from evaluators import compile_candidate

    templates = load_templates()
    jobs = [(s, c) for s in shapes for c in seeds_for(s, templates, arch, picks)]
    t0 = time.monotonic()
    print(f"compiling {len(jobs)} seed candidates of {len(shapes)} shapes for {arch} on {workers} workers", flush=True)
    failed = 0
    with ThreadPoolExecutor(max(1, workers)) as ex:  # each compile runs in its own child process
        for i, ((shape, cand), res) in enumerate(zip(jobs, ex.map(lambda j: compile_candidate(j[1], arch), jobs)), 1):
            if not res.ok:
                failed += 1
                print(f"  FAILED {shape} {cand.template} {json.dumps(cand.knobs)}: {res.status.value}: "
                      f"{res.message.splitlines()[0][:200] if res.message else ''}", flush=True)
            if i % 20 == 0 or i == len(jobs):
                print(f"  {i}/{len(jobs)} compiled, {failed} failed [{time.monotonic() - t0:.0f}s]", flush=True)
    print(f"compile-only: {len(jobs) - failed}/{len(jobs)} ok for {arch}", flush=True)
    return 1 if failed else 0


def summarize(rows: list[dict[str, Any]], not_run: list[str], wall: float, busy: float) -> dict[str, Any]:
    got = [r for r in rows if r["best_speedup"]]
    sp = [r["best_speedup"] for r in got]
    largest = sorted(rows, key=lambda r: r["flops"])[-10:]
    per_decade: dict[str, list[float]] = defaultdict(list)
    for r in got:
        per_decade[f"1e{int(math.log10(r['flops']))}"].append(r["best_speedup"])
    geo = lambda xs: math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None  # noqa: E731
    return {
        "shapes_run": len(rows), "shapes_with_ok_seed": len(got), "not_run": not_run,
        "geomean": geo(sp), "median": statistics.median(sp) if sp else None, "min": min(sp) if sp else None,
        "share_ge_1": sum(x >= 1 for x in sp) / len(sp) if sp else None,
        "share_ge_0.9": sum(x >= 0.9 for x in sp) / len(sp) if sp else None,
        "per_decade_geomean": {k: geo(v) for k, v in sorted(per_decade.items())},
        "ten_largest": [{"shape": f"{r['M']}x{r['N']}x{r['K']}", "speedup": r["best_speedup"],
                         "template": r["best_template"], "cublas_tflops": r["cublas_tflops"]} for r in largest],
        "wall_s": wall, "gpu_busy_fraction": busy,
    }


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    got = [r for r in rows if r["best_speedup"]]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for tpl in sorted({r["best_template"] for r in got}):
        pts = [r for r in got if r["best_template"] == tpl]
        ax.scatter([r["flops"] for r in pts], [r["best_speedup"] for r in pts], s=14, label=tpl)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(0.9, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("FLOPs (2MNK)")
    ax.set_ylabel("best seed / torch.matmul (device time)")
    ax.set_title("Seeds before evolution, H200, TN f32")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
