"""One GPU call for issue 34's kernel work: the alignment transform on ragged shapes and the wgmma
tile space on mid shapes, against cuBLAS (and the pad peer), about 5 minutes on an H200.

    python bench/align_mid_check.py [--out DIR] [--sections stage,ragged,mid,eval] [--peer-dir DIR]

- ``stage``: the pre-pass kernels alone (``_prelude/stage.cuh``, compiled from the sm90_wgmma
  template with STAGE AB): every staged copy equal to the zero-padded operand (odd and even
  column counts, a source that is not 16-byte aligned), and the copy's bandwidth (bytes read plus
  bytes written over GPU time).
- ``ragged``: shapes with a ragged K (TN; NN with ragged N too): every first pick of sm90_wgmma and
  streamk90 (which stage exactly the ragged operands) and their STAGE_PITCH / STAGE_FUSED
  variants, each checked against an fp32 reference (C NaN-poisoned) and timed beside cuBLAS in
  both layouts; with ``--peer-dir`` the pad peer (``pad_cublas.py``, imported at run time, never
  copied in) is run in this process on the same shapes.
  sm90_wgmma's picks also run as their twins: a staged pick read in place (``RAGGED`` 1, labels
  ``-ip<stages>r<raw stages>``) and an in-place pick staged (``-st<stages>``); the table gives the
  best of each kind.
- ``mid``: mid shapes (M 64-2047): sm90_wgmma over a grid of tiles, schedules, split-K and
  clusters, and streamk90's picks, against cuBLAS; the best variant per shape and where the first
  pick ranks.
- ``eval``: staged first picks through the evaluator itself (LocalPool: the correctness cascade
  with its generic ragged instances, hack checks, device timer).

Launches go through the evaluator's own binder (``evaluators.run._kernels.CandidateKernels``), so
the staged pointers and tensor maps are those the evaluator and an export use. Timing: CUDA-graph
replay over rotating operand sets > 3x L2 (``decode_dev.graph_us``). Prints tables last; writes
``align_mid_check.json`` under --out. Exit 1 when anything is wrong.
"""
from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import math
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from decode_dev import cdiv, compile_all, cublas_us, evaluate_candidates, frob_error, graph_us, rotation  # noqa: E402
from populations import Candidate, Shape, load_templates, roofline_time  # noqa: E402

RAGGED = ["777x1536x2883", "2000x3000x1001", "4096x4096x4095", "8192x8192x8191", "1000x5000x3001", "4000x11000x5003",
          "512x4096x1001", "300x1001x2050:NN", "129x4100x1030:NN",
          # seed 10's rows where the copies cost most (per call against B padded once: 0.94x / 1.97x, 1.41x / 3.13x)
          "22x6490x2881", "227x25573x2795", "440x1350x5345"]
MID = ["200x11008x4096", "777x1536x2880", "256x14336x4096", "512x6144x4096", "128x8192x2048", "384x5120x5120",
       "1024x4096x1024", "1536x2816x3584", "96x12288x4096", "640x2560x10240"]
EVAL = ["777x1536x2883", "300x1001x2050:NN", "65x8191x2057", "2000x3000x1001"]
STAGE_CASES = [(777, 2883, 64), (4096, 4095, 64), (1000, 1001, 8), (33, 7, 8), (5000, 3001, 64)]


def launcher(kernels: Any, shape: Shape) -> Callable[[Any, Any, Any], None]:
    """launch(a, b, c) through the evaluator's binder; the workspace starts as 0xFF bytes."""
    import torch

    call, ws, _ = kernels.bind(shape)
    wbuf = torch.full((max(ws, 1),), 0xFF, dtype=torch.uint8, device="cuda")

    def launch(a: Any, b: Any, c: Any) -> None:
        call({"A": a.data_ptr(), "B": b.data_ptr(), "C": c.data_ptr(), "workspace": wbuf.data_ptr()}, wbuf if ws else None)
    return launch


def layout_sets(shape: Shape, sets: list) -> list:
    """The rotation's (a, w, c) with w as the shape's B is stored (N x K for TN, K x N for NN)."""
    return sets if shape.layout == "TN" else [(a, w.t().contiguous(), c) for a, w, c in sets]


def check(shape: Shape, sets: list, launch: Callable) -> float:
    """Relative error of one call on set 0 (C NaN-poisoned) against fp32; inf if not finite."""
    import torch

    a, b, c = sets[0]
    ref = a.float() @ (b.float().t() if shape.layout == "TN" else b.float())
    c.fill_(float("nan"))
    launch(a, b, c)
    torch.cuda.synchronize()
    return frob_error(c, ref)


def roofline_us(s: Shape) -> float:
    return roofline_time(s) * 1e6  # issue 26's roofline with the H200's defaults (790 TFLOP/s, 4.5 TB/s)


class Kernels:
    """Compiled candidates by source, loaded once, bound per shape."""

    def __init__(self, cands: list[Candidate]) -> None:
        from evaluators.run._kernels import CandidateKernels
        from evaluators.run._loader import DriverLoader
        from evaluators.run._tmap import TmapCache

        self.compiled = compile_all(cands)
        self.loader, self.tmaps, self.cls = DriverLoader(), TmapCache(), CandidateKernels
        self.loaded: dict[tuple[str, str], Any] = {}

    def get(self, cand: Candidate) -> Any:
        res = self.compiled[cand.source]
        if not res.ok:
            raise RuntimeError(f"compile: {res.status} {res.message[-300:]}")
        key = (cand.source, json.dumps(cand.plan.to_dict(), sort_keys=True))  # a generic source serves many shapes
        if key not in self.loaded:
            self.loaded[key] = self.cls(self.loader, res.cubin, cand.plan, self.tmaps)
        return self.loaded[key]


def time_variants(shape: Shape, variants: list[tuple[str, Candidate]], kern: Kernels, rows: list, bad: list,
                  make_sets: Callable[[Shape], list] = rotation) -> None:
    """Check and time each variant at ``shape`` over ``make_sets(shape)`` beside cuBLAS; a row each."""
    import torch

    sets = make_sets(shape)
    cb_us, cb_layout = cublas_us(sets)
    tn_us = graph_us(sets, lambda a, w, c: torch.matmul(a, w.t(), out=c))
    lsets = layout_sets(shape, sets)
    for label, cand in variants:
        row = {"shape": str(shape), "variant": label, "template": cand.template, "knobs": cand.knobs,
               "cublas_us": cb_us, "cublas_layout": cb_layout, "cublas_tn_us": tn_us, "roof_us": roofline_us(shape)}
        try:
            launch = launcher(kern.get(cand), shape)
            row["err"] = check(shape, lsets, launch)
            if not row["err"] < 2e-3:
                bad.append(f"{shape} {label}: error {row['err']}")
            row["us"] = graph_us(lsets, launch)
            row["x"] = cb_us / row["us"]
        except Exception as exc:  # noqa: BLE001 - a failing variant is a row, not the end
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
            bad.append(f"{shape} {label}: {row['error']}")
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items() if k != "knobs"}), flush=True)
    del sets, lsets
    torch.cuda.empty_cache()


def stage_section(templates: dict, out: dict, bad: list) -> None:
    """The pre-pass kernels against torch's zero-padded copy, and their bandwidth."""
    import torch

    t = templates["sm90_wgmma"]
    shape = Shape.parse("777x1536x2883")
    cand = t.candidate(t.heuristic(shape, 90)[0], shape)
    kern = Kernels([cand])
    res = kern.compiled[cand.source]
    from evaluators.run._loader import DriverLoader
    drv = DriverLoader()
    module = drv.load(res.cubin)
    fn = drv.function(module, "evo_stage", 0)
    rows = []
    for r, c, p in STAGE_CASES:
        pitch = -(-c // p) * p
        for offset in (0, 1):
            base = torch.randn(r * c + offset, device="cuda", dtype=torch.half)
            src = base[offset:]
            dst = torch.full((r * pitch,), float("nan"), device="cuda", dtype=torch.half)
            from evaluators.run._tmap import ParamPack
            grid = (min(-(-(r * pitch // 8) // 256), 1056), 1, 1)
            go = drv.launcher(fn, grid, (256, 1, 1), 0)
            pack = ParamPack(["src", "dst", r, c, pitch], {"src": src.data_ptr(), "dst": dst.data_ptr()})
            stream = torch.cuda.current_stream().cuda_stream
            go(stream, pack)
            torch.cuda.synchronize()
            want = torch.zeros(r, pitch, device="cuda", dtype=torch.half)
            want[:, :c] = src.view(r, c)
            same = bool(torch.equal(dst.view(r, pitch), want))
            if not same:
                bad.append(f"stage {r}x{c} pitch {pitch} offset {offset}: copy differs")
            us = graph_us([(src, dst, None)], lambda a, w, _c: go(torch.cuda.current_stream().cuda_stream, pack))
            gbs = (r * c * 2 + r * pitch * 2) / us / 1e3
            rows.append({"rows": r, "cols": c, "pitch": pitch, "src_offset": offset, "same": same, "us": us, "GBps": gbs})
            print(json.dumps(rows[-1]), flush=True)
    out["stage"] = rows


def ragged_variants(templates: dict, shape: Shape) -> list[tuple[str, Candidate]]:
    out, seen = [], set()
    for name in ("sm90_wgmma", "streamk90"):
        t = templates[name]
        if not t.applicable(shape, 90):
            continue
        picks = t.heuristic(shape, 90)
        extra = []
        for k in picks[:1]:
            for pitch in (8, 64):
                for fused in (True, False):
                    extra.append(dict(k, STAGE_PITCH=pitch, STAGE_FUSED=fused))
        for i, k in enumerate(picks + extra):
            if t.check(k, shape, 90):
                continue
            c = t.candidate(k, shape)
            if c.id in seen:  # the content hash of source, plan and claim
                continue
            seen.add(c.id)
            label = f"{name}:{'pick' + str(i) if i < len(picks) else 'p' + str(k['STAGE_PITCH']) + ('f' if k['STAGE_FUSED'] else 's')}"
            out.append((label, c))
            if name == "sm90_wgmma" and i < len(picks):
                out += [(f"{label}-{tag}", tc) for tag, tc in twins(t, k, shape) if tc.id not in seen]
                seen.update(tc.id for _, tc in out)
        if name == "sm90_wgmma" and shape.layout == "TN" and shape.k % 8:
            # in-place tiles that fit beside the raw ring where the picks' own tiles do not
            width = 8 * cdiv(cdiv(shape.m, cdiv(shape.m, 96)), 8)
            for tag, k in (("ip128x128d", dict(BM=128, BN=128, STAGES=2, EPI="direct")),
                           ("ip128x64s", dict(BM=128, BN=64, STAGES=3, EPI="smem")),
                           (f"ipswap128x{width}t", dict(SWAP=True, BM=128, BN=width, STAGES=3, EPI="tsmem"))):
                for producers in (1, 2):  # RPRODUCERS 2: a second producer warpgroup, half the rows a thread
                    kp = dict(k, RAGGED=1, RPRODUCERS=producers, CONSUMERS=2, SCHED="coop", PERSISTENT=True)
                    if not t.check(kp, shape, 90):
                        c = t.candidate(kp, shape)
                        if c.id not in seen:
                            seen.add(c.id)
                            out.append((f"{name}:{tag}{'-p2' if producers == 2 else ''}", c))
    return out


def deepest_ring(t: Any, k: dict, shape: Shape, low: int, high: int | None = None) -> dict | None:
    """``k`` with the deepest ring (STAGES from ``high``, or the knob's largest, down to ``low``) that
    is valid at ``shape``; None if none is."""
    for st in sorted((v for v in t.space.knobs["STAGES"].values if low <= v <= (high or v)), reverse=True):
        if not t.check(t.space.complete(dict(k, STAGES=st)), shape, 90):
            return dict(k, STAGES=st)
    return None


def twins(t: Any, k: dict, shape: Shape) -> list[tuple[str, Candidate]]:
    """The other way of reading a ragged K (TN) with ``k``'s tile: a staged pick read in place
    (``RAGGED`` 1, the raw ring 2 or 3 deep, the deepest swizzled ring that still fits) or an
    in-place pick staged (its ring as deep as the staged rules make it); ``ip``/``st`` labels."""
    if shape.layout != "TN" or shape.k % 8 == 0:
        return []
    out = []
    if k.get("RAGGED"):
        staged = t.fitted(dict(k, RAGGED=0, RSTAGES=2), shape)
        kk = deepest_ring(t, staged, shape, k["STAGES"]) if staged else None
        return [(f"st{kk['STAGES']}", t.candidate(kk, shape))] if kk else []
    base = dict(k, RAGGED=1, STAGE="none", STAGE_PITCH=64, STAGE_FUSED=True, CLUSTER_M=1, CLUSTER_N=1)
    for rst in (2, 3):
        kk = deepest_ring(t, dict(base, RSTAGES=rst), shape, 2, max(4, k["STAGES"]))
        if kk:
            out.append((f"ip{kk['STAGES']}r{rst}", t.candidate(kk, shape)))
    return out


def variant_list(shape: Shape) -> tuple[list[tuple[str, Candidate]], Callable[[str, Any, dict], None]]:
    """(out, add): ``add(label, template, knobs)`` appends the fitted knob set's candidate to ``out``
    when it is valid at ``shape`` and not there yet (by candidate id)."""
    out: list[tuple[str, Candidate]] = []
    seen: set[str] = set()

    def add(label: str, tt: Any, k: dict) -> None:
        k = tt.fitted(k, shape) or k
        if tt.check(k, shape, 90):
            return
        c = tt.candidate(k, shape)
        if c.id not in seen:
            seen.add(c.id)
            out.append((label, c))
    return out, add


def mid_variants(templates: dict, shape: Shape) -> list[tuple[str, Candidate]]:
    """sm90_wgmma over a tile x schedule x split-K grid, and streamk90's picks (valid ones)."""
    t = templates["sm90_wgmma"]
    out, add = variant_list(shape)
    for i, k in enumerate(t.heuristic(shape, 90)):
        add(f"wgmma:pick{i}", t, k)
    for bm, bn, cons, sched in [(64, 128, 1, "coop"), (64, 256, 1, "coop"), (64, 192, 1, "coop"), (128, 128, 2, "coop"),
                                (128, 256, 2, "coop"), (128, 192, 2, "coop"), (128, 128, 2, "pingpong"),
                                (64, 256, 2, "pingpong"), (128, 64, 2, "pingpong"), (256, 128, 2, "coop")]:
        for split in (1, 2, 3, 4):
            for epi in ("smem", "direct"):
                if split > 1 and epi == "smem":
                    continue
                stages = {64: 6, 128: 4, 192: 4, 256: 3}[max(bm, bn) if bm <= 128 else 256]
                k = dict(BM=bm, BN=bn, CONSUMERS=cons, SCHED=sched, SPLIT_K=split, EPI=epi, STAGES=stages, PERSISTENT=True,
                         GROUP=8, RASTER="M", CLUSTER_M=1)
                add(f"wgmma:{bm}x{bn}c{cons}{sched[0]}{'' if split == 1 else f'k{split}'}{epi[0]}", t, k)
    def deepest(k: dict) -> dict | None:
        return deepest_ring(t, k, shape, 3)
    base = dict(SCHED="coop", SPLIT_K=1, EPI="smem", PERSISTENT=True, GROUP=8, RASTER="M")
    # clusters: none, two CTAs sharing B along M (-cm2), two sharing A along N (-cn2)
    clusters = {"": dict(CLUSTER_M=1, CLUSTER_N=1), "-cm2": dict(CLUSTER_M=2, CLUSTER_N=1),
                "-cn2": dict(CLUSTER_M=1, CLUSTER_N=2)}
    for tag, cl in clusters.items():  # the widest tiles with the deepest ring, alone and in a 2-CTA cluster
        for bm, bn, cons in [(128, 128, 2), (128, 192, 2), (64, 192, 1), (128, 256, 2), (64, 128, 1), (256, 128, 2)]:
            k = deepest(dict(base, BM=bm, BN=bn, CONSUMERS=cons, **cl))
            if k:
                add(f"wgmma:{bm}x{bn}c{cons}cs-deep{k['STAGES']}{tag}", t, k)
    # swapped: each cluster with the plain staging, and the transposed staging (EPI tsmem: stmatrix,
    # stores along C's rows) without a cluster, each with its own deepest ring (their staging sizes differ)
    swap_kinds = {**clusters, "-t": dict(clusters[""], EPI="tsmem")}
    if shape.layout == "TN":  # SWAP: N along the 64-row side, M along a width fitted to it
        for bm, cons in [(64, 1), (128, 2), (256, 2)]:
            waves = {max(1, sms // cdiv(shape.n, bm)) for sms in (132, 264)}  # M's tiles that fill whole waves
            for nt in sorted({cdiv(shape.m, w) for w in (32, 48, 64, 96, 128, 192, 256)} | waves):
                bn = 8 * cdiv(cdiv(shape.m, nt), 8)  # any multiple of 8: a cluster shares B in turns where halves split atoms
                for tag, extra in swap_kinds.items():
                    for k in (dict(base, SWAP=True, BM=bm, BN=bn, CONSUMERS=cons, STAGES=3 if bm > 128 else 4, **extra),
                              deepest(dict(base, SWAP=True, BM=bm, BN=bn, CONSUMERS=cons, **extra))):
                        if k:
                            add(f"wgmma:swap{bm}x{bn}s{k['STAGES']}{tag}", t, k)
        # swapped with split-K (partials stored transposed): M in one tile where it fits 256, K split
        # so that tiles x SPLIT_K fills one wave, and the splits around that
        if shape.m <= 512:  # M in one tile up to 256, in two up to 512
            mt = cdiv(shape.m, 256)
            bn, tiles = 8 * cdiv(cdiv(shape.m, mt), 8), mt * cdiv(shape.n, 128)
            for split in sorted({2, 3, 4, 6, 8, 12, 16} & set(range(2, 1 + min(64, cdiv(shape.k, 64) // 2)))):
                if tiles * split <= 2 * 132:
                    k = deepest(dict(base, SWAP=True, BM=128, BN=bn, CONSUMERS=2, SPLIT_K=split, EPI="direct"))
                    if k:
                        add(f"wgmma:swap128x{bn}k{split}s{k['STAGES']}", t, k)
    sk = templates["streamk90"]
    if sk.applicable(shape, 90):
        for i, k in enumerate(sk.heuristic(shape, 90)):
            add(f"streamk90:pick{i}", sk, k)
    return out


def peer_rows(peer_dir: str, shapes: list[Shape]) -> list[dict]:
    """The pad peer (``pad_cublas.py`` from ``peer_dir``) run in this process on the TN shapes."""
    path = Path(peer_dir) / "pad_cublas.py"
    if not path.is_file():
        print(f"pad peer not found at {path}; skipped", flush=True)
        return []
    spec = importlib.util.spec_from_file_location("pad_cublas_peer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    with tempfile.TemporaryDirectory() as tmp:
        table, dump = Path(tmp) / "shapes.csv", Path(tmp) / "peer.json"
        with open(table, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["M", "N", "K"])
            for s in shapes:
                if s.layout == "TN":
                    w.writerow([s.m, s.n, s.k])
        argv = sys.argv
        sys.argv = ["pad_cublas.py", str(table), "--json", str(dump)]
        try:
            mod.main()
        finally:
            sys.argv = argv
        return json.loads(dump.read_text()) if dump.is_file() else []


def ok_by_shape(rows: list[dict]) -> dict[str, list[dict]]:
    """Per shape (in order of first appearance), its timed rows whose error is under 2e-3."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["shape"], [])
        if "x" in r and r.get("err", 1) < 2e-3:
            by[r["shape"]].append(r)
    return by


def summarize(rows: list[dict], peers: list[dict]) -> list[str]:
    peer = {f"{p['M']}x{p['N']}x{p['K']}:TN:f32": p for p in peers}
    lines = ["| shape | cuBLAS us (layout) | cuBLAS roof | pick0 x | best x | best variant | best roof | pad_both x | pad_a x "
             "| best staged x | best in place x |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for shape, ok in ok_by_shape(rows).items():
        if not ok:
            lines.append(f"| {shape} | - | - | - | - | none ok | - | - | - | - | - |")
            continue
        best = max(ok, key=lambda r: r["x"])
        pick0 = next((r for r in ok if r["variant"].endswith("pick0")), None)
        p = peer.get(shape)
        kinds = [max((r["x"] for r in ok if bool((r.get("knobs") or {}).get("RAGGED")) == inplace), default=float("nan"))
                 for inplace in (False, True)]
        lines.append(f"| {shape} | {best['cublas_us']:.2f} ({best['cublas_layout']}) | {best['roof_us'] / best['cublas_us']:.2f} | "
                     f"{pick0['x'] if pick0 else float('nan'):.3f} | {best['x']:.3f} | {best['variant']} | "
                     f"{best['roof_us'] / best['us']:.2f} | {p['both_x'] if p else float('nan'):.3f} | "
                     f"{p['a_x'] if p else float('nan'):.3f} | {kinds[0]:.3f} | {kinds[1]:.3f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--sections", default="stage,ragged,mid,eval")
    ap.add_argument("--peer-dir", default=None, help="folder holding pad_cublas.py (e.g. .carry_shared/peers)")
    ap.add_argument("--mid", nargs="*", default=MID)
    ap.add_argument("--ragged", nargs="*", default=RAGGED)
    ap.add_argument("--only", default=None, metavar="REGEX",
                    help="time only the variants whose label matches (e.g. 'pick|k[0-9]' for the picks and the split-K tiles)")
    args = ap.parse_args()
    only = re.compile(args.only) if args.only else None
    sections = set(args.sections.split(","))
    import torch
    torch.zeros(1, device="cuda")  # the primary context, which the driver loader then shares
    templates = load_templates()
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    bad: list[str] = []
    t0 = time.time()
    if "stage" in sections:
        stage_section(templates, out, bad)
    tables = []
    for name, shapes, make in (("ragged", args.ragged, ragged_variants), ("mid", args.mid, mid_variants)):
        if name not in sections:
            continue
        shapes = [Shape.parse(s) for s in shapes]
        plan = [(s, [(lb, c) for lb, c in make(templates, s) if only is None or only.search(lb)]) for s in shapes]
        kern = Kernels([c for _, vs in plan for _, c in vs])
        print(f"{name}: {sum(len(v) for _, v in plan)} variants, {len(kern.compiled)} sources compiled "
              f"({sum(not r.ok for r in kern.compiled.values())} failed) at {time.time() - t0:.0f} s", flush=True)
        rows: list[dict] = []
        for s, vs in plan:
            time_variants(s, vs, kern, rows, bad)
        peers = peer_rows(args.peer_dir, shapes) if name == "ragged" and args.peer_dir else []
        out[name] = {"rows": rows, "peer": peers}
        tables.append((name, summarize(rows, peers)))
    if "eval" in sections:
        cands = []
        for text in EVAL:
            s = Shape.parse(text)
            for n in ("sm90_wgmma", "streamk90"):
                t = templates[n]
                if t.applicable(s, 90):
                    cands.append(t.candidate(t.heuristic(s, 90)[0], s))
        out["eval_bad"] = evaluate_candidates(cands)
        if out["eval_bad"]:
            bad.append(f"evaluator: {out['eval_bad']} staged first picks not ok or flagged")
    out["bad"] = bad
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "align_mid_check.json").write_text(json.dumps(out, indent=1, default=str))
    for name, lines in tables:
        print(f"\n## {name}\n" + "\n".join(lines))
    print(f"\n{len(bad)} problems" + "".join(f"\n  {b}" for b in bad[:20]) + f"\n{time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
