"""Small shapes where cuBLAS takes 3-15 us: which kernel of the space is fastest, on a GPU (issue 34).

    python bench/small_dev.py [--shapes 121x374x139 ...] [--tiny-grid 32] [--mma-grid 8] [--out DIR]
    python bench/small_dev.py --list [--shapes ...]            # the variants only (no GPU)
    python bench/small_dev.py --compile-only [--shapes ...]    # every source compiled here (no GPU)

Over random-shape seeds 9-17 (bench/RESULTS.md section 28) most of the mid rows whose best evolved
kernel stayed under cuBLAS were small: cuBLAS at 3-15 us, M 17-11000, many with a ragged K. With
about four evaluations a shape in a 100-shape run, the first picks decide those rows, so this
times, per shape: every applicable template's first two heuristic picks, tiny's short-K fragment
(16 x 8, 8 warps) and two wider tiles with K whole or split across a cluster (``c2``-``c8``), a pruned
grid of tiny's knobs (latency-first: fragments straight from global memory, no pipeline to fill;
K split through the workspace, ``s2``-``s8``, or a cluster) *whether or not tiny's ``applies``
rule admits the shape* (labels ``tiny!`` where it does not: the question is whether the rule
should), a small-tile grid of sm80_mma, and leaner sm90_wgmma kernels than its first picks (a
fitted BN, a shallow ring, one CTA a tile, split-K; tiles whose width is cut so that they fill one
or two waves of the SMs, swapped and not, as cuBLAS's mid-row kernels are: label ``w`` for
swapped), beside cuBLAS in both layouts.

Launches go through the evaluator's binder (``align_mid_check.Kernels``: staged plans, tensor
maps). Timing: CUDA-graph replay over a rotation of more than 3x L2 (no cap on the set count,
unlike ``decode_dev.rotation``: a small shape's operands must come from HBM, as in the
evaluator), each variant checked against an fp32 reference (C NaN-poisoned) first. Prints one
line per variant and a table per shape (first pick, best variant, best of tiny), and the kernels
cuBLAS launches for the shape in each layout (one call under torch.profiler: the tile and split
cuBLAS chose, the shape of kernel the space should hold); writes ``small_dev.json``. Exit 1 when
a variant is wrong.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from decode_dev import cdiv  # noqa: E402
from populations import Candidate, Shape, load_templates  # noqa: E402

#: rows of seeds 9-17 with cuBLAS at 3-15 us and the best evolved kernel under it: ragged K, then aligned
SHAPES = ["121x374x139", "80x401x201", "144x435x114", "309x216x274", "1309x480x78", "360x68x93", "35x2271x145",
          "1940x256x69", "173x119x621", "141x256x256", "191x512x768", "278x560x640", "121x960x640", "161x160x320",
          "323x752x1088", "2108x1120x496", "1158x592x3168", "11061x208x80", "3748x176x1312", "2694x128x256"]


def tiny_grid(t: Any, shape: Shape) -> list[dict]:
    """tiny's knob sets with 66-1584 CTAs and at most two K rounds per warp, K split 1-8 ways
    through the workspace (SPLIT_K, a reduce launch) or across a cluster (CLUSTER, one launch)."""
    steps = cdiv(shape.k, 16)
    out = []
    for tm in t.space.knobs["TM"].values:
        for tn in t.space.knobs["TN"].values:
            for warps in t.space.knobs["WARPS"].values:
                for ku in t.space.knobs["KU"].values:
                    for split in (1, 2, 4, 8):
                        ctas = cdiv(shape.m, tm) * cdiv(shape.n, tn) * split
                        rounds = cdiv(cdiv(steps, split), warps * ku)
                        for how in (("SPLIT_K", "CLUSTER") if split > 1 else ("SPLIT_K",)):
                            k = {**dict(TM=tm, TN=tn, WARPS=warps, KU=ku, SPLIT_K=1, CLUSTER=1), how: split}
                            if 66 <= ctas <= 1584 and rounds <= 2 and not t.check(k, shape, 90):
                                out.append(k)
    return out


def tiny_focus(t: Any, shape: Shape) -> list[dict]:
    """The short-K first pick's fragment (16 x 8, 8 warps, KU 2) and two wider tiles, each with K
    whole or split 2-8 ways across a cluster, up to four waves of CTAs: timed on every shape."""
    out = []
    for tm, tn in ((16, 8), (16, 16), (32, 16)):
        for cluster in (1, 2, 4, 8):
            k = dict(TM=tm, TN=tn, WARPS=8, KU=2, SPLIT_K=1, CLUSTER=cluster)
            if cdiv(shape.m, tm) * cdiv(shape.n, tn) * cluster <= 4224 and not t.check(k, shape, 90):
                out.append(k)
    return out


def tiny_label(k: dict) -> str:
    split = f"s{k['SPLIT_K']}" if k.get("CLUSTER", 1) == 1 else f"c{k['CLUSTER']}"
    return f"{k['TM']}x{k['TN']}w{k['WARPS']}u{k['KU']}{split}"


def mma_grid(t: Any, shape: Shape) -> list[dict]:
    """sm80_mma's small tiles (BM, BN 32-64), 2-3 stages, split-K 1-4, with at least 66 CTAs."""
    out = []
    for bm in (32, 64):
        for bn in (32, 64):
            for bk in (32, 64):
                for st in (2, 3):
                    for split in (1, 2, 4):
                        if cdiv(shape.m, bm) * cdiv(shape.n, bn) * split < 66:
                            continue
                        k = dict(t.space.defaults(), BM=bm, BN=bn, BK=bk, WM=min(bm, 32), WN=min(bn, 32), STAGES=st,
                                 SPLIT_K=split)
                        if not t.check(k, shape, 90):
                            out.append(k)
    return out


def wgmma_lean(t: Any, shape: Shape) -> list[dict]:
    """sm90_wgmma for a latency-bound row: BM 64 or 128, BN 64, 128 or the width fitted to N (one
    column of tiles where N <= 256), a ring only as deep as K needs (2 stages where K <= 128), one
    CTA a tile or persistent, K split 1, 2 or 4 ways (EPI direct), 33-528 work units. The first
    picks are 64 x 128 or 128 x 128 tiles, 8 stages, persistent, with half the SMs idle on these
    rows; this asks which leaner Hopper kernel of the space comes closest to cuBLAS there."""
    fit = min(256, cdiv(shape.n, 8) * 8)
    widths = sorted({64, 128} | ({fit} if shape.n <= 256 else set()))
    out = []
    for bm, cons in ((64, 1), (128, 2)):
        for bn in widths:
            for stages in ((2,) if shape.k <= 128 else (2, 4)):
                for persistent in (False, True):
                    for split in (1, 2, 4):
                        k = dict(t.space.defaults(), BM=bm, BN=bn, CONSUMERS=cons, SCHED="coop", STAGES=stages,
                                 PERSISTENT=persistent, SPLIT_K=split, EPI="smem" if split == 1 else "direct",
                                 CLUSTER_M=1, CLUSTER_N=1, SWAP=False)
                        k = t.fitted(k, shape) or k
                        if not t.check(k, shape, 90) and 33 <= t.space.env(k, shape)["UNITS"] <= 528:
                            out.append(k)
    return out


def wgmma_wave_fitted(t: Any, shape: Shape) -> list[dict]:
    """sm90_wgmma with the tile width fitted so that the tiles fill one wave of 132 SMs (or two),
    as cuBLAS's own kernels do on mid rows (``128x72``, ``128x104``, ``192x104``, ``256x88``: RESULTS
    27): unswapped, BN cut from N for BM-row tiles of M; swapped (``SWAP``), BN cut from M for BM-row
    tiles of N. One CTA a tile, K whole, a 4-stage ring (2 where K <= 128), the shared-memory
    epilogue; widths 32-256 only."""
    out = []
    for swap in (False, True):
        rows, cols = (shape.n, shape.m) if swap else (shape.m, shape.n)
        for bm, cons in ((64, 1), (128, 2)):
            for waves in (1, 2):
                per_row = (132 * waves) // cdiv(rows, bm)
                if per_row < 1:
                    continue
                bn = 8 * cdiv(cdiv(cols, per_row), 8)
                if not 32 <= bn <= 256:
                    continue
                k = dict(t.space.defaults(), BM=bm, BN=bn, CONSUMERS=cons, SCHED="coop",
                         STAGES=2 if shape.k <= 128 else 4, PERSISTENT=False, SPLIT_K=1, EPI="smem",
                         CLUSTER_M=1, CLUSTER_N=1, SWAP=swap)
                k = t.fitted(k, shape) or k
                if not t.check(k, shape, 90) and k not in out:
                    out.append(k)
    return out


def wgmma_thin_clusters(t: Any, shape: Shape) -> list[dict]:
    """sm90_wgmma as cuBLAS runs small mid rows (its kernel names there, RESULTS 27 (n), fourth run:
    ``64x24_64x16_2x4``, ``40x64_64x16_4x2``, ``64x32_64x16_4x2``): a 64-row tile of one consumer, a
    thin width (8-64, the narrow side fitted), a 12-stage ring, and a 2- or 4-CTA cluster sharing the
    wide operand by multicast along either axis; swapped and not, persistent or one CTA a tile."""
    out = []
    for swap in (False, True):
        cols = shape.m if swap else shape.n
        widths = sorted({w for w in (16, 24, 32, 40, 48, 64) if w <= max(16, 8 * cdiv(cols, 8))}
                        | ({8 * cdiv(cols, 8)} if cols <= 64 else set()))
        for bn in widths:
            for cm, cn in ((2, 1), (4, 1), (1, 2), (1, 4)):
                for persistent in (False, True):
                    k = dict(t.space.defaults(), BM=64, BN=bn, CONSUMERS=1, SCHED="coop", STAGES=12,
                             PERSISTENT=persistent, SPLIT_K=1, EPI="tsmem" if swap else "smem",
                             CLUSTER_M=cm, CLUSTER_N=cn, SWAP=swap)
                    if not t.check(k, shape, 90) and k not in out:
                        out.append(k)
    return out


def wgmma_output_bound(t: Any, shape: Shape) -> list[dict]:
    """sm90_wgmma where writing C is most of the work (K of a few 64-wide blocks, M x N large):
    persistent, two consumers cooperating on a tile or ping-ponging whole tiles (one's epilogue
    under the other's main loop, what CUTLASS uses where the epilogue dominates), BN 64-256, a
    2- or 4-stage ring (a smaller ring leaves room for a second CTA on the SM), the staged epilogue;
    only where K <= 256."""
    if shape.k > 256:
        return []
    out = []
    for sched in ("coop", "pingpong"):
        for bn in (64, 128, 256):
            for stages in (2, 4):
                k = dict(t.space.defaults(), BM=128, BN=bn, CONSUMERS=2, SCHED=sched, STAGES=stages,
                         PERSISTENT=True, SPLIT_K=1, EPI="smem", CLUSTER_M=1, CLUSTER_N=1, SWAP=False)
                k = t.fitted(k, shape) or k
                if not t.check(k, shape, 90) and k not in out:
                    out.append(k)
    return out


def wgmma_label(k: dict) -> str:
    swap = "w" if k.get("SWAP") else ""
    cluster = (f"c{k['CLUSTER_M']}x{k['CLUSTER_N']}" if k.get("CLUSTER_M", 1) * k.get("CLUSTER_N", 1) > 1 else "")
    pp = "pp" if k.get("SCHED") == "pingpong" else ""
    return f"{swap}{k['BM']}x{k['BN']}st{k['STAGES']}{'p' if k['PERSISTENT'] else 'n'}{pp}s{k['SPLIT_K']}{cluster}"


def variants(templates: dict, shape: Shape, tiny_cap: int, mma_cap: int,
             wgmma_cap: int = 12) -> list[tuple[str, Candidate]]:
    """(label, candidate): each applicable template's first two picks, then the two grids (thinned
    by a stable hash, so shapes whose grids agree share sources)."""
    from align_mid_check import variant_list
    from decode_dev import thin

    out, add = variant_list(shape)
    for name, t in templates.items():
        if t.applicable(shape, 90):
            for i, k in enumerate(t.heuristic(shape, 90)[:2]):
                add(f"{name}:pick{i}", t, k)
    tiny = templates["tiny"]
    mark = "tiny" if tiny.applicable(shape, 90) else "tiny!"
    for k in tiny_focus(tiny, shape) + thin(tiny_grid(tiny, shape), tiny_cap):
        add(f"{mark}:{tiny_label(k)}", tiny, k)
    mma = templates["sm80_mma"]
    for k in thin(mma_grid(mma, shape), mma_cap):
        add(f"sm80_mma:{k['BM']}x{k['BN']}x{k['BK']}st{k['STAGES']}s{k['SPLIT_K']}", mma, k)
    wg = templates["sm90_wgmma"]
    if wg.applicable(shape, 90):
        for k in (thin(wgmma_lean(wg, shape), wgmma_cap) + wgmma_wave_fitted(wg, shape)  # the fitted: all of them
                  + thin(wgmma_thin_clusters(wg, shape), 2 * wgmma_cap) + wgmma_output_bound(wg, shape)):
            add(f"sm90_wgmma:{wgmma_label(k)}", wg, k)
    return out


def hbm_rotation(shape: Shape) -> list[tuple[Any, Any, Any]]:
    """(a, w, c) sets covering more than 3x L2 (w as N x K), carved from three big tensors, every
    matrix starting on a 256-byte boundary as an allocation does (an odd M x K packed tightly put
    every other set's A 2 bytes off, which kernels may assume away)."""
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    m, n, k = shape.m, shape.n, shape.k
    sets = max(2, math.ceil(3 * l2 / (2 * (m * k + n * k + m * n))))

    def carve(rows: int, cols: int, fill: bool) -> list:
        slot = -(-rows * cols // 128) * 128  # elements: 256 bytes
        flat = (torch.randn if fill else torch.empty)(sets * slot, device="cuda", dtype=torch.half)
        return [flat[i * slot:i * slot + rows * cols].view(rows, cols) for i in range(sets)]
    return list(zip(carve(m, k, True), carve(n, k, True), carve(m, n, False)))


def table(rows: list[dict]) -> list[str]:
    """Per shape: cuBLAS, the first pick, the best variant and tiny's best (markdown rows)."""
    from align_mid_check import ok_by_shape

    lines = ["| shape | cuBLAS us (layout) | native first pick x (label) | best x | best variant | best tiny x | tiny variant |",
             "|---|---:|---:|---:|---|---:|---|"]
    for shape, ok in ok_by_shape(rows).items():
        if not ok:
            lines.append(f"| {shape} | - | - | - | none ok | - | - |")
            continue
        best = max(ok, key=lambda r: r["x"])
        first = next((r for r in ok if r["variant"] == "sm90_wgmma:pick0"),  # the seeding's first, on sm_90a
                     next((r for r in ok if r["variant"].endswith("pick0")), None))
        tiny = max((r for r in ok if r["variant"].startswith("tiny")), key=lambda r: r["x"], default=None)
        lines.append(f"| {shape} | {best['cublas_us']:.2f} ({best['cublas_layout']}) | "
                     f"{first['x'] if first else float('nan'):.3f} ({first['variant'] if first else '-'}) | "
                     f"{best['x']:.3f} | {best['variant']} | {tiny['x'] if tiny else float('nan'):.3f} | "
                     f"{tiny['variant'] if tiny else '-'} |")
    return lines


def cublas_kernels(shape: Shape) -> dict[str, list[str]]:
    """The CUDA kernels cuBLAS runs for one call of ``shape`` in each layout (TN: B stored N x K,
    as nn.Linear; NN: K x N), in launch order, from one profiled call after a warm-up call."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    m, n, k = shape.m, shape.n, shape.k
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b_nk = torch.randn(n, k, device="cuda", dtype=torch.float16)
    b_kn = b_nk.t().contiguous()
    out: dict[str, list[str]] = {}
    for layout, call in (("TN", lambda: torch.matmul(a, b_nk.t())), ("NN", lambda: torch.matmul(a, b_kn))):
        call()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        names = [e.name for e in sorted(prof.events(), key=lambda e: e.time_range.start)
                 if e.device_type == torch.autograd.DeviceType.CUDA]
        out[layout] = [x for x in names if not x.startswith(("Memset", "Memcpy"))]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=SHAPES)
    ap.add_argument("--tiny-grid", type=int, default=32, help="tiny knob sets per shape (stable subset)")
    ap.add_argument("--mma-grid", type=int, default=8, help="sm80_mma small-tile sets per shape")
    ap.add_argument("--wgmma-grid", type=int, default=12, help="sm90_wgmma lean sets per shape")
    ap.add_argument("--budget-s", type=float, default=240.0, help="time no new shape after this")
    ap.add_argument("--list", action="store_true", help="print the variants per shape and stop (no GPU)")
    ap.add_argument("--compile-only", action="store_true", help="compile every variant's source here and stop (no GPU)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    templates = load_templates()
    shapes = [Shape.parse(s) for s in args.shapes]
    plan = [(s, variants(templates, s, args.tiny_grid, args.mma_grid, args.wgmma_grid)) for s in shapes]
    if args.list:
        for s, vs in plan:
            print(f"{s}: {len(vs)} variants: " + " ".join(lb for lb, _ in vs))
        return 0
    if args.compile_only:
        from decode_dev import compile_all

        results = compile_all([c for _, vs in plan for _, c in vs])
        failed = [r for r in results.values() if not r.ok]
        print(f"{len(results)} sources compiled for sm_90a, {len(failed)} failed"
              + "".join(f"\n  {r.status}: {r.message[-300:]}" for r in failed[:5]))
        return 1 if failed else 0
    import torch

    from align_mid_check import Kernels, time_variants

    t0 = time.time()
    torch.zeros(1, device="cuda")
    kern = Kernels([c for _, vs in plan for _, c in vs])
    print(f"{sum(len(v) for _, v in plan)} variants, {len(kern.compiled)} sources "
          f"({sum(not r.ok for r in kern.compiled.values())} failed to compile) at {time.time() - t0:.0f} s", flush=True)
    rows: list[dict] = []
    bad: list[str] = []
    for s, vs in plan:
        if time.time() - t0 > args.budget_s:
            print(f"budget: {s} and later shapes not timed", flush=True)
            break
        time_variants(s, vs, kern, rows, bad, make_sets=hbm_rotation)
    kernels: dict[str, dict[str, list[str]]] = {}
    for s, _ in plan:
        try:
            kernels[str(s)] = cublas_kernels(s)
        except Exception as exc:  # a profiler failure costs the names, not the timings
            kernels[str(s)] = {"error": [f"{type(exc).__name__}: {exc}"]}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "small_dev.json").write_text(json.dumps({"rows": rows, "bad": bad, "cublas_kernels": kernels},
                                                              indent=1, default=str))
    print("\n" + "\n".join(table(rows)))
    print("\ncuBLAS's kernels (TN | NN):" + "".join(
        f"\n  {shape}: {' + '.join(v.get('TN', []))} | {' + '.join(v.get('NN', v.get('error', [])))}"
        for shape, v in kernels.items()))
    print(f"\n{len(bad)} problems" + "".join(f"\n  {b}" for b in bad[:20]) + f"\n{time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
