"""Decode/latency kernel development on the GPU: knob sweeps of the gemv, swab and swpipe templates
against cuBLAS and the plain peer, in one process (issue 26).

    python bench/decode_dev.py [--shapes 1x4096x4096 ... | --csv ../.carry_shared/shapes/llm_layers.csv]
                               [--picks-only] [--picks 4] [--per-template 24] [--max-grid 120] [--budget-s 200]
                               [--floors] [--eval-shapes 1x4096x4096 ...] [--out DIR] [--compile-only]

For every shape, each applicable decode template (gemv, swab, swpipe) contributes its heuristic picks
(``evo seed``'s first picks, at most 4) plus, unless ``--picks-only``, a pruned grid of the knobs
that matter (``grid``, at most ``--max-grid`` sets per template and shape, the same stable-hash
subset wherever the grids agree, so sources are shared between shapes) or ``--per-template``
seeded valid samples. ``--csv`` takes the decode rows
(M <= 8) and the rows under 1e8 FLOP of a shapes CSV, and the M=8 rows of ``NK16`` again at M=16.
Every distinct source is compiled once through the project's compile path (``CompilePool``:
static scan, NVRTC, ptxas resource policy; sm_90a), loaded with cupy and launched from the
template's resolved plan. Each variant is checked against an fp32 torch reference (C poisoned with
NaN first) and timed by CUDA-graph replay over rotating operand sets of more than 3x L2 (weights
come from HBM, as in a model), beside torch.matmul(a, w.t()) (cuBLAS, TN) and the best launch
configuration of the plain peer ``../.carry_shared/peers/plain_gemv.py`` (imported at run time,
never part of the repository; at every M <= 16 with K % 8 == 0, its configurations first launched
once each in a child by bench/_peer_screen.py, the hanging ones and those past ``--peer-screen-s``
left out; its best configuration is timed again after evo's variants and the
faster of the two timings kept, so the order of timing favours the peer, not evo). ``--floors``
adds, per shape with weights >= 8 MB, an empty kernel's and a pure streaming read's time on the
same bytes (bench/decode_floors.py): what launch and ramp-up cost, which no kernel avoids. Ragged shapes (``RAGGED``, one with a misaligned A) are checked for
correctness only. Last, ``--eval-shapes`` run each template's first pick through the evaluator
itself (``LocalPool``, device timer, hack checks) to confirm status ok and no flags.

Prints one line per shape (cuBLAS, peer, first pick and best variant in us, roofline fractions
max(2MNK / 790e12, bytes / 4.3e12)), writes ``decode_dev.json`` (every variant's time) to --out.
Exit 1 when any variant is wrong or fails to compile.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/'s helpers (_peer_screen, _llm_timer, decode_floors)

from populations import Candidate, Shape, load_templates  # noqa: E402

PEAK_FLOPS, PEAK_BW = 790e12, 4.3e12
TEMPLATES = ("gemv", "swab", "swpipe")
# decode rows of llm_layers.csv (N x K of each model's layers) at M = 1, 8, 16, and small/skinny shapes
NK = ["2304x768", "768x3072", "50257x768", "576x576", "3072x576", "49152x576", "896x896", "4864x896", "151936x896",
      "2304x2304", "9216x2304", "256000x2304", "3072x3072", "8192x3072", "4096x4096", "6144x4096", "14336x4096",
      "4096x14336", "28672x4096", "128256x4096"]
NK16 = ["2304x768", "576x576", "896x896", "4864x896", "2304x2304", "3072x3072", "4096x4096", "14336x4096",
        "4096x14336", "1152x896", "6144x4096", "50257x768", "9216x3072"]  # the last 4: the LLM-layer sample's
SHAPES = ([f"{m}x{nk}" for m in (1, 8) for nk in NK] + ["8x960x576", "8x576x1536", "1x960x576"]
          + ["4x4096x4096", "2x2304x768", "64x576x576", "64x768x768", "64x960x576", "64x2304x768", "32x4096x4096",
             "64x4096x4096"] + [f"16x{nk}" for nk in NK16])
RAGGED = ["1x1x1", "3x77x9", "5x1000x1001", "7x33x4100", "13x129x520", "2x8191x17", "64x1x2049", "40x100x72",
          "1x4096x4104", "13x2049x1032", "5x1000x4100", "16x4099x1000", "3x3000x2056"]  # the last 4: swpipe's
MISALIGNED = "5x1000x1001"  # also run with A offset by one element (2-byte aligned)
EVAL_SHAPES = ["1x4096x4096", "1x576x576", "8x4096x4096", "8x3072x3072", "8x2304x768", "16x896x896", "64x576x576",
               "5x1000x1001", "3x77x9"]


def roofline_us(s: Shape) -> float:
    return max(2 * s.m * s.n * s.k / PEAK_FLOPS, 2 * (s.m * s.k + s.n * s.k + s.m * s.n) / PEAK_BW) * 1e6


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def gemv_tokens(m: int) -> int:
    """Tokens a gemv CTA holds at M tokens: every one (TOK takes any count 1-8, none clamped), past 8
    the fewest groups of at most 8 (9 = 5 + 4), as gemv's own picks at M 9..12."""
    return cdiv(m, cdiv(m, 8))


def grid(name: str, shape: Shape) -> list[dict]:
    """A pruned full grid over the knobs that matter at this shape: PIPE only where a thread runs
    more than one iteration, at most 4 iterations (more are serial round trips), >= 100 CTAs."""
    m, n, k = shape.m, shape.n, shape.k
    out = []
    if name == "gemv":
        tok = gemv_tokens(m)
        for rows in (1, 2, 4, 8):
            for warps in (2, 4, 8):
                for unroll in (1, 2, 4):
                    for cluster in (1, 2, 4):
                        iters = cdiv(cdiv(cdiv(k, 8), cluster), warps * 32 * unroll)
                        ctas = cdiv(n, rows) * cluster
                        for pipe in ((0, 1) if iters > 1 else (0,)):
                            if iters <= 2 + 2 * pipe and ctas >= 100 and (cluster == 1 or iters == 1 or ctas < 2000):
                                out.append(dict(ROWS=rows, TOK=tok, WARPS=warps, UNROLL=unroll, PIPE=pipe, CLUSTER=cluster))
    elif name == "swpipe":
        nt = 1 if m <= 8 else 2
        for rt in (1, 2, 4):
            for warps in (4, 8):
                for kt in (64, 128, 256):
                    for stages in (3, 4, 6, 8):
                        for tpc in (1, 2, 4, 8):
                            for cluster in (1, 2, 4, 8):
                                ctas = cdiv(cdiv(n, 16 * rt), tpc) * cdiv(m, 8 * nt) * cluster
                                flight = (stages - 1) * 16 * rt * kt * 2
                                need = cdiv(cdiv(k, kt), cluster) * kt  # token columns per CTA
                                xk = next((x for x in (512, 1024, 2048, 4096, 8192) if x >= need), None)
                                if 128 <= ctas <= 2112 and 12288 <= flight <= 98304 and cluster <= cdiv(k, kt) and xk:
                                    for pf in (0, 1):
                                        out.append(dict(RT=rt, NT=nt, WARPS=warps, KT=kt, STAGES=stages, TPC=tpc,
                                                        CLUSTER=cluster, L2PF=pf, XK=xk))
    else:
        if m < 5:  # one or few tokens: gemv's CUDA cores
            return []
        nts = sorted({next(t for t in (1, 2, 4, 8) if 8 * t >= min(m, 64)), 1})
        for rt in (1, 2, 4):
            for nt in nts:
                for warps in (4, 8):
                    for u in (1, 2, 3, 4, 6, 8):
                        for cluster in (1, 2, 4, 8):
                            for wmap in (0, 1):  # 1: each warp its own rows over the CTA's K (swab's WMAP)
                                per_warp = 1 if wmap else warps  # warps sharing one row tile's K steps
                                iters = cdiv(cdiv(cdiv(k, 32), cluster), per_warp * u)
                                ctas = cdiv(n, 16 * rt * (warps if wmap else 1)) * cdiv(m, 8 * nt) * cluster
                                for pipe in ((0, 1) if iters > 1 else (0,)):
                                    if iters <= 2 + 2 * pipe + 2 * wmap and ctas >= 100 and not (u == 8 and rt == 4):
                                        out.append(dict(RT=rt, NT=nt, WARPS=warps, U=u, PIPE=pipe, CLUSTER=cluster,
                                                        WMAP=wmap))
    return out


def peer_shapes(shape: Shape) -> list[dict]:
    """gemv knob sets at the launch shapes the plain peer's CUDA-core kernel wins with on decode rows
    (1 or 2 rows a CTA, 2, 4 or 8 warps) with every token in the CTA, UNROLL 1 and 2, the plain
    loop (PIPE 0) and no cluster: where the pruned grid thins them away, the comparison of the two
    kernels at one launch shape is lost. Past M = 8 (TOK's domain) the tokens in the fewest groups."""
    tok = gemv_tokens(shape.m)
    return [dict(ROWS=rows, TOK=tok, WARPS=warps, UNROLL=unroll, PIPE=0, CLUSTER=1)
            for rows in (1, 2) for warps in (2, 4, 8) for unroll in (1, 2)]


def pow2(x: int) -> int:
    """The least power of two >= x."""
    return 1 << max(0, x - 1).bit_length()


def thin(sets: list[dict], cap: int) -> list[dict]:
    """At most ``cap`` of ``sets``: those first in a stable hash order of their items, so two shapes
    whose grids share knob sets keep the same ones (their sources compile once)."""
    import hashlib

    key = lambda k: hashlib.sha1(repr(sorted(k.items())).encode()).hexdigest()  # noqa: E731
    return sorted(sets, key=key)[:cap] if len(sets) > cap else sets


def csv_shapes(path: str) -> list[str]:
    """Decode rows (M <= 8) and rows under 1e8 FLOP of a shapes CSV (header M,N,K,...), in file
    order without repeats, then the M=8 rows whose N x K is in ``NK16`` again at M=16."""
    import csv

    out: list[str] = []
    with open(path) as fh:
        for row in csv.DictReader(fh):
            m, n, k = int(row["M"]), int(row["N"]), int(row["K"])
            if (m <= 8 or 2 * m * n * k < 1e8) and f"{m}x{n}x{k}" not in out:
                out.append(f"{m}x{n}x{k}")
    return out + [f"16x{nk}" for nk in NK16 if f"8x{nk}" in out]


def baseline_picks(t: Any, shape: Shape, baseline: dict[str, dict], n: int) -> list[dict]:
    """The first ``n`` heuristic picks the template made before knob values were added to it: its
    picks now, less those where a knob named in ``baseline[t.name]`` is off its old fixed value
    (exact when the new values came with new rules only, inserted among the old ones)."""
    fixed = baseline.get(t.name, {})
    return [k for k in t.heuristic(shape, 90) if all(k.get(x) == v for x, v in fixed.items())][:n]


def variants(shape: Shape, templates: dict[str, Any], per_template: int, seed: int,
             use_grid: bool = True, picks_only: bool = False, max_grid: int = 120,
             n_picks: int = 4, baseline: dict[str, dict] | None = None) -> list[tuple[str, dict, str]]:
    """(template, knobs, origin): the heuristic picks (and, with ``baseline``, the old picks: origin
    base<i>), then the pruned grid (``grid``) or a seeded sample of valid sets, dropping those the
    template refuses."""
    out: list[tuple[str, dict, str]] = []
    for name in TEMPLATES:
        t = templates[name]
        if not t.applicable(shape, 90):
            continue
        seen: set[tuple] = set()
        picks = [(k, f"heuristic{i}") for i, k in enumerate(t.heuristic(shape, 90)[:n_picks])]
        if baseline is not None:
            picks += [(k, f"base{i}") for i, k in enumerate(baseline_picks(t, shape, baseline, n_picks))]
        full = [k for k in grid(name, shape) if not t.check(dict(t.space.defaults(), **k), shape, 90)] if use_grid else []
        full = thin(full, max_grid)
        if name == "gemv":
            # each pick holding a token count off the powers of two (TOK = M = 3) beside its
            # power-of-two twin (the count the picks held before TOK took every value): settles TOK = M
            picks += [(dict(k, TOK=pow2(k["TOK"])), "tokpow2") for k, o in picks
                      if o.startswith("heur") and pow2(k["TOK"]) != k["TOK"]]
            if not picks_only:  # the plain peer's own launch shapes (1 or 2 rows a CTA, 2-8 warps, all
                # tokens, the plain loop, no cluster), never thinned away: kernel against kernel
                picks += [(dict(t.space.defaults(), **k), "peershape") for k in peer_shapes(shape)]
        if picks_only:  # and each swab pick with the other K order (KMAP), to settle that knob
            picks += [(dict(k, KMAP=1 - k["KMAP"]), "kmap") for k, o in picks if name == "swab" and o.startswith("heur")]
        elif full:
            picks += [(dict(t.space.defaults(), **k), "grid") for k in full]
        else:
            rng = random.Random(f"{seed}:{shape}:{name}")
            picks += [(k, "sample") for k in t.sample(rng, shape, per_template if not use_grid else 8, arch=90)]
        at: dict[tuple, int] = {}  # a knob set picked twice (a new pick that is also an old one) is timed once,
        for knobs, origin in picks:  # its origins joined with '+' (heuristic0+base0)
            key = tuple(sorted(knobs.items()))
            if key in at:
                n, k, o = out[at[key]]
                out[at[key]] = (n, k, o if origin in o.split("+") else f"{o}+{origin}")
            elif key not in seen and not t.check(knobs, shape, 90):
                seen.add(key)
                at[key] = len(out)
                out.append((name, knobs, origin))
    return out


def has_origin(row: dict, origin: str) -> bool:
    return origin in row["origin"].split("+")


def pick_us(rows: list[dict], prefix: str, n: int) -> float | None:
    """The fastest of the first ``n`` picks of that kind (prefix heuristic or base) over the templates."""
    ts = [r["us"] for r in rows if any(has_origin(r, f"{prefix}{i}") for i in range(n))]
    return min(ts) if ts else None


def compile_all(cands: list[Candidate]) -> dict[str, Any]:
    """source text -> CompileResult, each distinct source compiled once (sm_90a)."""
    from evaluators import CompilePool

    by_source = {c.source: c for c in cands}
    with CompilePool(workers=min(14, os.cpu_count() or 2), use_cache=False) as pool:
        futs = {src: pool.submit(c, "sm_90a") for src, c in by_source.items()}
        return {src: f.result() for src, f in futs.items()}


class Loaded:
    """A compiled candidate's kernels in cupy, launched from its plan resolved at one shape."""

    def __init__(self, cubin: bytes, tmp: Path) -> None:
        import cupy as cp

        path = tmp / f"k{abs(hash(cubin))}.cubin"
        path.write_bytes(cubin)
        self.module = cp.RawModule(path=str(path))
        self.fns: dict[str, Any] = {}
        self.smem: dict[str, int] = {}  # dynamic shared memory each kernel was opened up to

    def launcher(self, cand: Candidate, shape: Shape) -> Callable[[Any, Any, Any], None]:
        """launch(a, b, c) for ``shape``; a plan's workspace is one buffer of its own, filled with
        0xFF bytes once and never zeroed (``launch.workspace``: refill it to play the evaluator)."""
        import cupy as cp
        import torch

        launches, ws = cand.plan.resolve(shape)
        wbuf = torch.full((ws,), 0xFF, dtype=torch.uint8, device="cuda") if ws else None
        steps = []
        for ln in launches:
            fn = self.fns.get(ln.kernel) or self.fns.setdefault(ln.kernel, self.module.get_function(ln.kernel))
            if ln.smem > self.smem.get(ln.kernel, 0):  # dynamic + static past 48 KiB is opt-in per function
                self.smem[ln.kernel] = ln.smem
                try:
                    fn.max_dynamic_shared_size_bytes = ln.smem
                except AttributeError:  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
                    cp.cuda.driver.funcSetAttribute(fn.ptr, 8, ln.smem)
            steps.append((fn, ln))

        def launch(a: Any, w: Any, c: Any) -> None:
            ptrs = {"A": a.data_ptr(), "B": w.data_ptr(), "C": c.data_ptr(), "workspace": wbuf.data_ptr() if ws else 0}
            with cp.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
                for fn, ln in steps:
                    args = tuple(ptrs[x] if isinstance(x, str) else cp.int32(x) for x in ln.args)
                    fn(ln.grid, ln.block, args, shared_mem=ln.smem)
        launch.workspace = wbuf  # type: ignore[attr-defined]
        return launch


def rotation(s: Shape, misalign: bool = False, min_sets: int = 2) -> list[tuple[Any, Any, Any]]:
    import torch

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    per = 2 * (s.m * s.k + s.n * s.k + s.m * s.n)
    sets = max(min_sets, min(48, math.ceil(3 * l2 / per)))
    out = []
    for _ in range(sets):
        if misalign:
            a = torch.randn(s.m * s.k + 1, device="cuda", dtype=torch.half)[1:].view(s.m, s.k)
        else:
            a = torch.randn(s.m, s.k, device="cuda", dtype=torch.half)
        out.append((a, torch.randn(s.n, s.k, device="cuda", dtype=torch.half),
                    torch.empty(s.m, s.n, device="cuda", dtype=torch.half)))
    return out


def graph_us(sets: list, launch: Callable, reps: int = 10, min_launches: int = 24) -> float:
    """Median GPU time per call (us): one CUDA graph of a launch on every set (the set list repeated
    to at least ``min_launches`` launches), replayed. Each timed replay is enqueued right behind an
    untimed one, so the GPU never waits for the host to submit it: the start event lands when the
    previous replay ends, not before the graph launch (with few sets per replay, that host-side
    gap was counted as kernel time: up to several us per call on shapes of 2-6 sets)."""
    import torch

    repeat = max(1, -(-min_launches // len(sets)))
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for a, w, c in sets[:2]:
            launch(a, w, c)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            for a, w, c in sets:
                launch(a, w, c)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        graph.replay()  # keeps the GPU busy while the timed replay is submitted
        e0.record()
        graph.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / (len(sets) * repeat))
    del graph
    return statistics.median(times)


def reference(sets: list) -> Any:
    """fp32 C of the first rotation set (computed once per shape: the weights can be 1 GB)."""
    a, w, _ = sets[0]
    return (a.float() @ w.float().t(), )


def frob_error(c: Any, ref: Any) -> float:
    """||C - ref|| / ||ref|| of an fp16 output against its fp32 reference; inf when C is not finite
    (an output left unwritten on NaN-poisoned C): the export timer's own measure."""
    from evo.export._export_timer import rel_error as export_rel_error

    return export_rel_error(c, ref)


def rel_error(sets: list, launch: Callable, ref: Any) -> float:
    """Relative Frobenius error of one launch on set 0, whose C is NaN-poisoned first (inf when any
    output stays unwritten or is not finite)."""
    import torch

    a, w, c = sets[0]
    c.fill_(float("nan"))
    launch(a, w, c)
    torch.cuda.synchronize()
    return frob_error(c, ref[0])


def wrong_where(sets: list, ref: Any) -> str:
    """Where set 0's C (after a wrong launch) is off: counts and the first bad (m, n)s, to debug."""
    import torch

    c, r = sets[0][2].float(), ref[0]
    bad = ~torch.isfinite(c) | ((c - r).abs() > 0.05 * r.abs().max().clamp_min(1e-3))
    idx = bad.nonzero()[:6].tolist()
    return f"{int(bad.sum())} of {bad.numel()} bad, rows {int(bad.any(1).sum())}/{c.shape[0]}, " \
           f"cols {int(bad.any(0).sum())}/{c.shape[1]}, first {idx}"


def peer_path(where: str | None = None) -> Path | None:
    """The plain peer's file: ``where``, else the shared folder (beside or inside the checkout, or
    carried as .carry_shared/); None when it is not there."""
    here = Path(__file__).resolve().parent.parent
    paths = [root / sub / "peers" / "plain_gemv.py" for root in (here.parent, here) for sub in (".carry_shared", "shared")]
    return next((path for path in ([Path(where)] if where else paths) if path.is_file()), None)


def load_peer(where: str | None = None) -> Any:
    """The plain peer module (see :func:`peer_path`), or None when it is not there."""
    path = peer_path(where)
    if path is not None:
        from _peer_screen import import_peer  # bench/: the benchmarks' one importer of peer files

        return import_peer(path)
    print("peer not found (peers/plain_gemv.py under shared/ or .carry_shared/, in or beside the checkout): "
          "its column stays empty", flush=True)
    return None


def peer_runs(s: Shape) -> bool:
    """The shapes the plain peer has kernels for: M <= 16, rows on the 16-byte grid (K % 8 == 0)."""
    return s.m <= 16 and s.k % 8 == 0


def peer_jobs(runner: Any, shapes: list[Shape]) -> list[tuple[int, int, int, str]]:
    """(m, n, k, configuration) for every configuration ``runner`` (bench/_llm_timer.PeerRunner) built
    at every shape the peer runs: what bench/_peer_screen.py launches once each in a child, by the
    same names, before any is timed here."""
    return [(s.m, s.n, s.k, name) for s in shapes if peer_runs(s) for name in runner.names(s.m)]


def peer_best(runner: Any, s: Shape, sets: list, ref: Any,
              skip: frozenset = frozenset()) -> tuple[float | None, str, Callable | None]:
    """The peer's best launch configuration at this shape (its own config lists, built by ``runner``, a
    bench/_llm_timer.PeerRunner): us, label, launcher. ``skip``: (m, n, k, name) of configurations
    not to launch (the screen found them hanging, or never reached them)."""
    if runner is None or not peer_runs(s):
        return None, "", None
    best: tuple[float | None, str, Callable | None] = (None, "", None)
    for kind, mm, r, wp in runner.configs(s.m):
        fn = runner.fns.get((kind, mm, r, wp))
        if fn is None or (s.m, s.n, s.k, runner.name(kind, mm, r, wp)) in skip:
            continue
        launch = runner.mod.ours(kind, fn, r, wp)
        if not rel_error(sets, launch, ref) < 2e-3:
            continue
        t = graph_us(sets, launch)
        if best[0] is None or t < best[0]:
            best = (t, f"{kind[0]}{r},{wp}", launch)
    return best


def cublas(a: Any, w: Any, c: Any) -> None:
    import torch

    torch.matmul(a, w.t(), out=c)


def cublas_us(sets: list) -> tuple[float, str]:
    """cuBLAS in the better of the two layouts: TN (a @ w.t(), nn.Linear's) and NN (a @ b with b =
    w.t() stored K x N), each graph-replayed over the rotation; (us, layout)."""
    import torch

    t_tn = graph_us(sets, cublas)
    nn_b = [w.t().contiguous() for _, w, _ in sets]
    nn_sets = [(a, b, c) for (a, _, c), b in zip(sets, nn_b)]
    t_nn = graph_us(nn_sets, lambda a, b, c: torch.matmul(a, b, out=c))
    del nn_sets, nn_b
    return (t_tn, "TN") if t_tn <= t_nn else (t_nn, "NN")


def new_value_picks(t: Any, shape: Shape, baseline: dict[str, dict] | None) -> list[dict]:
    """The template's first pick with each knob value ``baseline`` marks as new forced into it (the
    valid ones): every new value gets checked at every shape, ragged ones included."""
    out = []
    first = t.heuristic(shape, 90)[:1]
    for knob, old in ((baseline or {}).get(t.name) or {}).items():
        for v in t.space.knobs[knob].values:
            if first and v != old and not t.check(dict(first[0], **{knob: v}), shape, 90):
                out.append(dict(first[0], **{knob: v}))
    return out


def evaluator_check(shapes: list[Shape], templates: dict[str, Any], baseline: dict[str, dict] | None = None) -> int:
    """Each template's first pick through LocalPool (correctness, hack checks, device timer), and
    with ``baseline`` its first pick with each new knob value."""
    cands = []
    for s in shapes:
        for n in TEMPLATES:
            t = templates[n]
            if t.applicable(s, 90):
                for k in t.heuristic(s, 90)[:1] + new_value_picks(t, s, baseline):
                    cands.append(t.candidate(k, s))
    return evaluate_candidates(cands)


def evaluate_candidates(cands: list[Candidate]) -> int:
    """Candidates through the evaluator itself (LocalPool, device timer): prints one line each and
    returns how many were not ok or were flagged."""
    from evaluators import LocalPool

    bad = 0
    with LocalPool(gpus=[0], compile_workers=8, timers=("device",)) as pool:
        for c, f in [(c, pool.submit(c)) for c in cands]:
            for e in f.result():
                ok = e.status.value == "ok" and not e.flags
                bad += not ok
                print(f"eval {str(c.shapes[0]):>16} {c.template:>7} {json.dumps(c.knobs, sort_keys=True)}: "
                      f"{e.status.value} flags={list(e.flags)} speedup={e.fitness} err={e.max_error} "
                      f"{'' if ok else e.message[:300]}", flush=True)
    return bad


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=SHAPES)
    p.add_argument("--csv", help="take the shapes from this CSV instead (see csv_shapes)")
    p.add_argument("--picks-only", action="store_true", help="time only the heuristic picks (evo seed's)")
    p.add_argument("--per-template", type=int, default=24)
    p.add_argument("--picks", type=int, default=4, help="heuristic picks per template and shape (evo seed's first)")
    p.add_argument("--max-grid", type=int, default=120, help="grid knob sets per template and shape (stable subset)")
    p.add_argument("--floors", action="store_true", help="empty-kernel and streaming-read floors on weights >= 8 MB")
    p.add_argument("--budget-s", type=float, default=200.0, help="stop timing new shapes after this")
    p.add_argument("--eval-shapes", nargs="*", default=EVAL_SHAPES)
    p.add_argument("--seed", type=int, default=26)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--compile-only", action="store_true", help="compile every variant here (no GPU)")
    p.add_argument("--baseline", type=json.loads, default=None, metavar="JSON",
                   help="also time the old picks (origin base<i>): per template, the knob values its space was fixed "
                        "at before new values came with new rules, e.g. '{\"gemv\": {\"TILES\": 1}}'; prints "
                        "old and new first picks (and the best of the first --picks of each) per shape")
    p.add_argument("--peer", help="path of the plain peer (plain_gemv.py); default: shared/ or .carry_shared/ "
                                  "peers/, in or beside the checkout")
    p.add_argument("--peer-screen-s", type=float, default=90.0,
                   help="deadline of the peer's hang screen (bench/_peer_screen.py; configurations it does not "
                        "reach are not timed); 0: no screen, every configuration launched here")
    args = p.parse_args()
    t0 = time.monotonic()
    templates = load_templates()
    shapes = [Shape.parse(x) for x in (csv_shapes(args.csv) if args.csv else args.shapes)]
    ragged = [Shape.parse(x) for x in RAGGED]
    plan = {s: variants(s, templates, args.per_template, args.seed, picks_only=args.picks_only, max_grid=args.max_grid,
                        n_picks=args.picks, baseline=args.baseline) for s in shapes}
    plan.update({s: variants(s, templates, 6, args.seed, use_grid=False)
                 + [(n, k, "newvalue") for n in TEMPLATES if templates[n].applicable(s, 90)
                    for k in new_value_picks(templates[n], s, args.baseline)] for s in ragged})
    cands = {(s, n, tuple(sorted(k.items()))): (templates[n].candidate(k, s), o) for s, vs in plan.items() for n, k, o in vs}
    compiled = compile_all([c for c, _ in cands.values()])
    failed = [(str(key[0]), key[1], dict(key[2]), r.message[-400:]) for key, (c, _) in cands.items()
              if not (r := compiled[c.source]).ok]
    spills = {src: [(k.name, k.registers, k.spill_stores) for k in r.kernels] for src, r in compiled.items()
              if r.ok and any(k.spill_stores or k.stack_frame for k in r.kernels)}
    print(f"compiled {len(compiled)} sources for {len(cands)} variants in {time.monotonic() - t0:.0f} s: "
          f"{len(failed)} failed, {len(spills)} spill", flush=True)
    for f in failed[:10]:
        print("COMPILE FAIL", f, flush=True)
    spilled = [(key[1], dict(key[2])) for key, (c, _) in cands.items() if c.source in spills]
    for name, knobs in spilled[:8]:
        print("SPILL", name, json.dumps(knobs, sort_keys=True), flush=True)
    if args.compile_only:
        return 1 if failed else 0

    import torch

    peer = load_peer(args.peer)
    # the peer at every M <= 16 of the shapes (its build is one NVRTC call, a few seconds an M), each of
    # its configurations launched once in a child first: some never return on some rows (mma<1,1,4> at
    # M = 3-7 on the random-shape seeds), and a hung kernel would take this process with it
    from _llm_timer import PeerRunner

    peer_ms = sorted({s.m for s in shapes if peer_runs(s)})
    runner = PeerRunner(peer, peer_ms) if peer is not None and peer_ms else None
    peer_skip: frozenset = frozenset()
    if runner is not None and args.peer_screen_s > 0:
        from _peer_screen import screen

        screened = screen(peer_path(args.peer), peer_jobs(runner, shapes), deadline_s=args.peer_screen_s,
                          log=lambda line: print(line, flush=True))
        peer_skip = screened.skip
        print(f"peer screen: {len(screened.hung)} hanging, {len(screened.unscreened)} not screened, "
              f"{time.monotonic() - t0:.0f} s", flush=True)
    floors = None
    if args.floors:
        from decode_floors import Floors

        floors = Floors()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp())
    loaded: dict[str, Loaded] = {}
    wrong: list[str] = []
    records: list[dict[str, Any]] = []

    def checked(s: Shape, name: str, knobs: dict, sets: list, ref: Any, tag: str = "") -> Callable | None:
        """The variant's launcher when it compiled and is correct on set 0; a wrong one is recorded."""
        cand = cands[(s, name, tuple(sorted(knobs.items())))][0]
        r = compiled[cand.source]
        if not r.ok:
            return None
        mod = loaded.get(cand.source) or loaded.setdefault(cand.source, Loaded(r.cubin, tmp))
        launch = mod.launcher(cand, s)
        err = rel_error(sets, launch, ref)
        if not err < 2e-3:
            wrong.append(f"{s}{tag} {name} {knobs}: rel err {err:.2e}; {wrong_where(sets, ref)}")
            return None
        return launch

    # ragged shapes: correctness only (one of them with a misaligned A too)
    for s in ragged:
        for misalign in ((False, True) if str(s).startswith(MISALIGNED) else (False,)):
            sets = rotation(s, misalign, min_sets=1)[:1]
            ref = reference(sets)
            for name, knobs, _ in plan[s]:
                checked(s, name, knobs, sets, ref, " misaligned" if misalign else "")
            del sets, ref
    print(f"ragged correctness: {len(wrong)} wrong, {time.monotonic() - t0:.0f} s", flush=True)
    for line in wrong[:20]:
        print("WRONG", line, flush=True)

    print(f"{'shape':>16} {'MB':>6} | {'cuBLAS':>7} {'roof':>4} | {'peer':>7} {'roof':>4} {'cfg':>6} | "
          f"{'first':>7} {'best':>7} {'roof':>4} {'x cuB':>5} {'x peer':>6} | best knobs", flush=True)
    for s in shapes:
        if time.monotonic() - t0 > args.budget_s:
            print(f"not timed (budget): {s}", flush=True)
            continue
        floor = roofline_us(s)
        sets = rotation(s)
        ref = reference(sets)
        t_cb, layout = cublas_us(sets)
        t_peer, peer_cfg, peer_launch = peer_best(runner, s, sets, ref, peer_skip)
        rows = []
        for name, knobs, origin in plan[s]:
            launch = checked(s, name, knobs, sets, ref)
            if launch is not None:
                rows.append({"template": name, "knobs": knobs, "origin": origin, "us": graph_us(sets, launch)})
        peer_again = graph_us(sets, peer_launch) if peer_launch is not None else None
        if peer_again is not None:
            t_peer = min(t_peer, peer_again)
        extra: dict[str, Any] = {}
        if floors is not None and 2 * s.n * s.k >= 8e6:
            extra["empty_us"] = floors.empty_us(sets, graph_us)
            extra["read_us"], extra["read_cfg"] = floors.read_us(sets, graph_us)
        del sets, ref
        torch.cuda.empty_cache()
        rec = {"shape": str(s), "m": s.m, "n": s.n, "k": s.k, "weight_mb": 2 * s.n * s.k / 1e6, "floor_us": floor,
               "cublas_us": t_cb, "cublas_layout": layout, "peer_us": t_peer, "peer_cfg": peer_cfg,
               "peer_again_us": peer_again, **extra, "variants": rows}
        records.append(rec)
        (out / "decode_dev.json").write_text(json.dumps(records, indent=0))
        if not rows:
            print(f"{str(s):>16} no correct variant", flush=True)
            continue
        best = min(rows, key=lambda r: r["us"])
        first = [r["us"] for r in rows if has_origin(r, "heuristic0")]
        pr = f"{t_peer:7.2f} {floor / t_peer:4.2f} {peer_cfg:>6}" if t_peer else f"{'-':>7} {'-':>4} {'':>6}"
        xp = f"{t_peer / best['us']:6.2f}" if t_peer else f"{'-':>6}"
        print(f"{str(s).split(':')[0]:>16} {rec['weight_mb']:6.1f} | {t_cb:7.2f} {floor / t_cb:4.2f} | {pr} | "
              f"{min(first) if first else float('nan'):7.2f} {best['us']:7.2f} {floor / best['us']:4.2f} "
              f"{t_cb / best['us']:5.2f} {xp} | {best['template']} {json.dumps(best['knobs'], sort_keys=True)}",
              flush=True)
        if args.baseline is not None:
            old1, new1 = pick_us(rows, "base", 1), pick_us(rows, "heuristic", 1)
            oldn, newn = pick_us(rows, "base", args.picks), pick_us(rows, "heuristic", args.picks)
            rec["picks"] = {"old_first": old1, "new_first": new1, "old_best": oldn, "new_best": newn}
            (out / "decode_dev.json").write_text(json.dumps(records, indent=0))
            f = lambda x: f"{x:7.2f}" if x else f"{'-':>7}"  # noqa: E731
            xp = lambda x: f"{t_peer / x:5.3f}" if x and t_peer else "    -"  # noqa: E731
            print(f"{'':>16}   picks old first {f(old1)} new first {f(new1)} | first {args.picks}: old {f(oldn)} "
                  f"new {f(newn)} | x peer: old first {xp(old1)} new first {xp(new1)} old {xp(oldn)} new {xp(newn)}",
                  flush=True)
        per_t = {n: min(r["us"] for r in rows if r["template"] == n) for n in TEMPLATES if any(r["template"] == n for r in rows)}
        fl = f"; empty {extra['empty_us']:.2f} read {extra['read_us']:.2f} us ({floor / extra['read_us']:.2f} roof)" \
            if "read_us" in extra else ""
        print(f"{'':>16}   per template " + " ".join(f"{n} {u:.2f}" for n, u in per_t.items()) + fl, flush=True)
    gm = lambda xs: math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")  # noqa: E731
    timed = [r for r in records if r["variants"]]
    for label, sel in (("all", timed), ("M<=16", [r for r in timed if r["m"] <= 16]),
                       ("M<=16, >= 8 MB", [r for r in timed if r["m"] <= 16 and r["weight_mb"] >= 8]),
                       ("M<=16, < 8 MB", [r for r in timed if r["m"] <= 16 and r["weight_mb"] < 8])):
        if sel:
            bests = [min(v["us"] for v in r["variants"]) for r in sel]
            firsts = [min([v["us"] for v in r["variants"] if has_origin(v, "heuristic0")] or [b]) for r, b in zip(sel, bests)]
            peers = [(r["peer_us"], b) for r, b in zip(sel, bests) if r["peer_us"]]
            print(f"{label:>16}: n={len(sel)} best x cuBLAS {gm([r['cublas_us'] / b for r, b in zip(sel, bests)]):.3f}, "
                  f"first pick x cuBLAS {gm([r['cublas_us'] / f for r, f in zip(sel, firsts)]):.3f}, "
                  f"best x peer {gm([p / b for p, b in peers]):.3f} (min {min([p / b for p, b in peers] or [0]):.2f}), "
                  f"roofline {gm([r['floor_us'] / b for r, b in zip(sel, bests)]):.2f}", flush=True)
    picked = [r for r in timed if r.get("picks") and r["picks"]["old_first"] and r["picks"]["new_first"]]
    for label, sel in (("picks, all", picked), ("picks, M=1", [r for r in picked if r["m"] == 1]),
                       ("picks, M=8..16", [r for r in picked if r["m"] > 1])):
        if sel:
            parts = []
            for key in ("old_first", "new_first", "old_best", "new_best"):
                xs = [r["peer_us"] / r["picks"][key] for r in sel if r["peer_us"] and r["picks"][key]]
                cb = gm([r["cublas_us"] / r["picks"][key] for r in sel if r["picks"][key]])
                parts.append(f"{key} x cuBLAS {cb:.3f} x peer {gm(xs):.3f} (min {min(xs or [0]):.3f})")
            print(f"{label:>16}: n={len(sel)} " + "; ".join(parts), flush=True)
    print(f"timing done in {time.monotonic() - t0:.0f} s; {len(wrong)} wrong", flush=True)
    for line in wrong[:20]:
        print("WRONG", line, flush=True)
    bad = 0
    if args.eval_shapes:
        bad = evaluator_check([Shape.parse(x) for x in args.eval_shapes], templates, args.baseline)
    print(f"all done in {time.monotonic() - t0:.0f} s", flush=True)
    return 1 if failed or wrong or bad else 0


if __name__ == "__main__":
    sys.exit(main())
