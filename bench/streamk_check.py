"""One short GPU check for issue 26's kernel changes: gemv's ISSUE loop on M=1 rows beside the
plain peer, and the stream-K families (streamk over mma.sync, streamk90 over wgmma) on mid shapes,
against cuBLAS (about 2 minutes on an H200).

    python bench/streamk_check.py [--out DIR] [--no-eval] [--compile-only]

1. Correctness: every variant below, and the streamk picks at ragged shapes (TN and NN), on fresh
   random inputs with C poisoned (NaN) first, against an fp32 torch reference (relative Frobenius
   error < 2e-3). A streamk workspace starts as 0xFF bytes and is refilled with 0x7F before a second
   call (its flags must not depend on what is there, and a launch must leave them usable).
2. GPU time (CUDA-graph replay over rotating operand sets > 3x L2, bench/decode_dev.py's timer) against
   cuBLAS in the better of TN and NN: on ``GEMV_ROWS``, gemv's first two picks with ISSUE 0 and 1 and
   the plain peer's best launch (``../shared/peers/plain_gemv.py``, imported at run time, never copied
   in); on ``MID``, streamk's picks plus a CPS x DP sweep of its first pick's tile, and sm80_mma's
   first pick (the same mainloop, data-parallel or split-K: what stream-K scheduling adds);
   streamk90's picks plus a DP x tile sweep (``streamk90_variants``) and sm90_wgmma's first pick
   (the same wgmma mainloop, data-parallel or split-K with a reduce launch). streamk90 is also
   checked at ``RAGGED90`` (shapes TMA can describe; K down to one block). Its plans pass TMA
   tensor maps, launched through the evaluator's driver loader and parameter packs (TmapLoaded).
3. Unless ``--no-eval`` (or more than ``--eval-after-s`` 90 s are spent by then): streamk's first
   pick on two shapes through the evaluator itself (``LocalPool``: hostile workspace refills, hack
   checks, device timer).
Prints a compact table last; writes streamk_check.json to --out. Exit 1 when anything is wrong or
fails to compile.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from decode_dev import (Loaded, compile_all, cublas_us, evaluate_candidates, graph_us, load_peer,  # noqa: E402
                        peer_best, reference, rel_error, roofline_us, rotation, wrong_where)
from populations import Candidate, Shape, load_templates  # noqa: E402

GEMV_ROWS = ["1x4096x4096", "1x3072x8192", "1x4096x14336", "1x2304x2304"]
MID = ["128x8192x2048", "12288x64x12288", "64x4096x4096", "512x896x4864", "256x14336x4096", "64x3072x8192"]
RAGGED = ["77x5000x1001", "300x4100x1030:NN", "200x129x4100", "65x8191x2056", "1000x70x3000:NN", "33x3000x777"]
RAGGED90 = ["77x5000x1000", "300x4104x1032:NN", "200x129x4104", "65x8191x2056", "1000x72x3000:NN", "130x4100x56",
            "7x13x24:NN"]
EVAL = ["128x8192x2048", "300x4100x1030"]
EVAL90 = ["128x8192x2048", "300x4104x1032"]


def gemv_variants(t: Any, s: Shape) -> list[tuple[str, dict]]:
    """gemv's first two picks at ``s``, each with ISSUE 0 and ISSUE 1 (PIPE 0)."""
    out = []
    for i, knobs in enumerate(t.heuristic(s, 90)[:2]):
        for issue in (0, 1):
            k = dict(knobs, ISSUE=issue, PIPE=0 if issue else knobs["PIPE"])
            if not t.check(k, s, 90):
                out.append((f"pick{i} ISSUE={issue}", k))
    return out


def streamk_variants(t: Any, s: Shape) -> list[tuple[str, dict]]:
    """streamk's picks at ``s`` (sm_90), then CPS 1/2 x DP 0/1/2 on the first pick's tile."""
    picks = t.heuristic(s, 90)
    out = [(f"pick{i}", k) for i, k in enumerate(picks[:4])]
    seen = {json.dumps(k, sort_keys=True) for _, k in out}
    if picks:
        for cps in (1, 2):
            for dp in (0, 1, 2):
                k = dict(picks[0], CPS=cps, DP=dp)
                key = json.dumps(k, sort_keys=True)
                if key not in seen and not t.check(k, s, 90):
                    seen.add(key)
                    out.append((f"CPS{cps} DP{dp}", k))
    return out


def streamk90_variants(t: Any, s: Shape) -> list[tuple[str, dict]]:
    """streamk90's picks at ``s``, then DP 0/1/2 on the first pick's tile, then the other tiles
    (128x128, 128x192 and 128x64 with two consumers, 64x128 and 64x192 with one; the deepest ring
    that fits) at the first pick's DP."""
    picks = t.heuristic(s, 90)
    out = [(f"pick{i}", k) for i, k in enumerate(picks[:4])]
    seen = {json.dumps(k, sort_keys=True) for _, k in out}

    def add(label: str, k: dict) -> None:
        key = json.dumps(k, sort_keys=True)
        if key not in seen and not t.check(k, s, 90):
            seen.add(key)
            out.append((label, k))

    if picks:
        for dp in (0, 1, 2):
            add(f"DP{dp}", dict(picks[0], DP=dp))
        for bm, bn, cons in ((128, 128, 2), (128, 192, 2), (128, 64, 2), (64, 128, 1), (64, 192, 1)):
            for stages in (7, 6, 5, 4):
                k = dict(picks[0], BM=bm, BN=bn, CONSUMERS=cons, STAGES=stages)
                if not t.check(k, s, 90):
                    add(f"{bm}x{bn}c{cons}s{stages}", k)
                    break
    return out


class TmapLoaded:
    """A compiled candidate whose plan passes TMA tensor maps by value (sm90_wgmma, streamk90), which
    cupy cannot: launched through the evaluator's driver loader and ``ParamPack``s, on torch's
    current stream (CUDA-graph capture included: the driver copies the parameters at launch)."""

    def __init__(self, cubin: bytes) -> None:
        from evaluators.run._loader import DriverLoader

        self.drv = DriverLoader()
        self.module = self.drv.load(cubin)

    def launcher(self, cand: Candidate, shape: Shape) -> Callable[[Any, Any, Any], None]:
        """launch(a, b, c) like ``Loaded.launcher``; ``launch.workspace`` starts as 0xFF bytes."""
        import torch
        from evaluators.run._tmap import ParamPack, TmapCache

        launches, ws = cand.plan.resolve(shape)
        wbuf = torch.full((ws,), 0xFF, dtype=torch.uint8, device="cuda") if ws else None
        cache = TmapCache()
        specs = cand.plan.tensor_maps
        tables = {name: cache.table(spec, shape) for name, spec in specs.items()}
        steps = [(self.drv.launcher(self.drv.function(self.module, ln.kernel, ln.smem), ln.grid, ln.block, ln.smem),
                  ParamPack(ln.args)) for ln in launches]

        def launch(a: Any, w: Any, c: Any) -> None:
            ptrs = {"A": a.data_ptr(), "B": w.data_ptr(), "C": c.data_ptr(), "workspace": wbuf.data_ptr() if ws else 0}
            stream = torch.cuda.current_stream().cuda_stream
            for go, pack in steps:
                pack.fill(ptrs, {n: tables[n](ptrs[specs[n].matrix]) for n in pack.tmap_names})
                go(stream, pack)
        launch.workspace = wbuf  # type: ignore[attr-defined]
        return launch


def evaluator_check(templates: dict[str, Any]) -> int:
    """streamk's first pick on ``EVAL`` and streamk90's on ``EVAL90`` through LocalPool; the number
    not ok or flagged."""
    t, t90 = templates["streamk"], templates["streamk90"]
    return evaluate_candidates([t.candidate((t.heuristic(s, 90) or [t.space.defaults()])[0], s)
                                for s in map(Shape.parse, EVAL)]
                               + [t90.candidate((t90.heuristic(s, 90) or [t90.space.defaults()])[0], s)
                                  for s in map(Shape.parse, EVAL90)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--no-eval", action="store_true", help="skip the LocalPool pass")
    p.add_argument("--eval-after-s", type=float, default=90.0, help="skip the LocalPool pass when later than this")
    p.add_argument("--compile-only", action="store_true", help="compile every variant here (no GPU)")
    args = p.parse_args()
    t0 = time.monotonic()
    templates = load_templates()
    g, sk, mma = templates["gemv"], templates["streamk"], templates["sm80_mma"]
    sk90, wg = templates["streamk90"], templates["sm90_wgmma"]
    plan: dict[Shape, list[tuple[str, str, dict]]] = {}
    for text in GEMV_ROWS:
        s = Shape.parse(text)
        plan[s] = [("gemv", label, k) for label, k in gemv_variants(g, s)]
    for text in MID:
        s = Shape.parse(text)
        plan[s] = [("streamk", label, k) for label, k in streamk_variants(sk, s)]
        plan[s].append(("sm80_mma", "pick0", mma.heuristic(s, 90)[0]))
        plan[s] += [("streamk90", label, k) for label, k in streamk90_variants(sk90, s)]
        plan[s].append(("sm90_wgmma", "pick0", wg.heuristic(s, 90)[0]))
    ragged = [Shape.parse(x) for x in RAGGED]
    for s in ragged:
        picks = sk.heuristic(s, 90) or [sk.space.defaults()]
        plan[s] = [("streamk", f"pick{i}", k) for i, k in enumerate(picks[:3])]
    for s in map(Shape.parse, RAGGED90):
        picks = sk90.heuristic(s, 90) or [sk90.space.defaults()]
        variants = picks[:2] + [dict(picks[0], DP=dp) for dp in (0, 1, 2) if dp != picks[0]["DP"]]
        plan.setdefault(s, []).extend(("streamk90", f"v{i}", k) for i, k in enumerate(variants) if not sk90.check(k, s, 90))
        if s not in ragged:
            ragged.append(s)
    cands: dict[tuple[Shape, str, str], Candidate] = {
        (s, n, label): templates[n].candidate(k, s) for s, vs in plan.items() for n, label, k in vs}
    compiled = compile_all(list(cands.values()))
    failed = [(str(key[0]), key[1], key[2], r.message[-300:]) for key, c in cands.items() if not (r := compiled[c.source]).ok]
    spills = [(str(key[0]), key[1], key[2]) for key, c in cands.items()
              if compiled[c.source].ok and any(k.spill_stores or k.stack_frame for k in compiled[c.source].kernels)]
    print(f"compiled {len(compiled)} sources for {len(cands)} variants in {time.monotonic() - t0:.0f} s: "
          f"{len(failed)} failed, {len(spills)} spill", flush=True)
    for f in failed[:10] + spills[:10]:
        print("COMPILE", f, flush=True)
    if args.compile_only:
        return 1 if failed else 0

    import torch

    tmp = Path(tempfile.mkdtemp())
    loaded: dict[str, Loaded] = {}
    wrong: list[str] = []

    def checked(s: Shape, name: str, label: str, sets: list, ref: Any) -> Callable | None:
        """The variant's launcher when it is correct on set 0, twice (workspace 0xFF, then 0x7F)."""
        cand = cands[(s, name, label)]
        r = compiled[cand.source]
        if not r.ok:
            return None
        mod = loaded.get(cand.source) or loaded.setdefault(
            cand.source, TmapLoaded(r.cubin) if cand.plan.tensor_maps else Loaded(r.cubin, tmp))
        launch = mod.launcher(cand, s)
        for fill in (None, 0x7F):
            if fill is not None and launch.workspace is not None:
                launch.workspace.fill_(fill)
            err = rel_error(sets, launch, ref)
            if not err < 2e-3:
                wrong.append(f"{s} {name} {label} {cand.knobs}: rel err {err:.2e}; {wrong_where(sets, ref)}")
                return None
        return launch

    # ragged shapes, correctness only (NN shapes get B stored K x N)
    for s in ragged:
        sets = rotation(s, min_sets=1)[:1]
        ref = reference(sets)
        if s.layout == "NN":
            sets = [(a, w.t().contiguous(), c) for a, w, c in sets]
        for name, label, _ in plan[s]:
            checked(s, name, label, sets, ref)
        del sets, ref
    print(f"ragged correctness: {len(wrong)} wrong, {time.monotonic() - t0:.0f} s", flush=True)

    from _llm_timer import PeerRunner

    peer = load_peer()
    runner = PeerRunner(peer, [1]) if peer is not None else None
    records = []
    for s in [Shape.parse(x) for x in GEMV_ROWS + MID]:
        sets = rotation(s)
        ref = reference(sets)
        t_cb, layout = cublas_us(sets)
        rec: dict[str, Any] = {"shape": str(s).split(":")[0], "floor_us": roofline_us(s), "cublas_us": t_cb,
                               "cublas_layout": layout, "variants": []}
        if s.m == 1:
            rec["peer_us"], rec["peer_cfg"], _ = peer_best(runner, s, sets, ref)
        for name, label, knobs in plan[s]:
            launch = checked(s, name, label, sets, ref)
            if launch is not None:
                rec["variants"].append({"template": name, "label": label, "knobs": knobs, "us": graph_us(sets, launch)})
        records.append(rec)
        del sets, ref
        torch.cuda.empty_cache()
        print(f"{rec['shape']}: cuBLAS {t_cb:.2f} us ({layout}), " + ", ".join(
            f"{v['template']} {v['label']} {v['us']:.2f}" for v in rec["variants"]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "streamk_check.json").write_text(json.dumps(records, indent=0))

    late = time.monotonic() - t0 > args.eval_after_s
    if late and not args.no_eval:
        print(f"evaluator pass skipped: {time.monotonic() - t0:.0f} s spent (--eval-after-s {args.eval_after_s:.0f})")
    bad = 0 if args.no_eval or late else evaluator_check(templates)
    print(f"\nall done in {time.monotonic() - t0:.0f} s; {len(failed)} compile failures, {len(wrong)} wrong, "
          f"{bad} not ok in the evaluator", flush=True)
    for line in wrong[:12]:
        print("WRONG", line, flush=True)
    print(f"\n{'shape':>15} {'cuBLAS':>7} {'roof':>4} | {'peer':>6} | {'ISSUE0':>6} {'ISSUE1':>6} | "
          f"{'sm80':>6} {'sk1st':>6} {'skbest':>6} | {'sm90':>6} {'sk90_1':>6} {'sk90bst':>7} | {'x cuB':>5} {'roof':>4} | best")
    for r in records:
        vs = r["variants"]
        best_of = lambda pred: min([v["us"] for v in vs if pred(v)] or [math.nan])  # noqa: E731
        best = min(vs, key=lambda v: v["us"]) if vs else None
        ours = best_of(lambda v: v["template"] not in ("sm80_mma", "sm90_wgmma")) if vs else math.nan
        cells = [f"{r['shape']:>15} {r['cublas_us']:7.2f} {r['floor_us'] / r['cublas_us']:4.2f}",
                 f"{r.get('peer_us') or math.nan:6.2f}",
                 f"{best_of(lambda v: v['label'].endswith('ISSUE=0')):6.2f} {best_of(lambda v: v['label'].endswith('ISSUE=1')):6.2f}",
                 f"{best_of(lambda v: v['template'] == 'sm80_mma'):6.2f} {best_of(lambda v: v['label'] == 'pick0' and v['template'] == 'streamk'):6.2f} "
                 f"{best_of(lambda v: v['template'] == 'streamk'):6.2f}",
                 f"{best_of(lambda v: v['template'] == 'sm90_wgmma'):6.2f} "
                 f"{best_of(lambda v: v['label'] == 'pick0' and v['template'] == 'streamk90'):6.2f} "
                 f"{best_of(lambda v: v['template'] == 'streamk90'):7.2f}",
                 f"{r['cublas_us'] / ours:5.2f} {r['floor_us'] / ours:4.2f}",
                 f"{best['template']} {best['label']}" if best else "none correct"]
        print(" | ".join(cells), flush=True)
    return 1 if failed or wrong or bad else 0


if __name__ == "__main__":
    sys.exit(main())
