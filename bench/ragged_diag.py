"""Where a ragged-K kernel goes wrong, if it does: each case of sm90_wgmma's RAGGED producer run
alone in a child process (a hang or a fault ends that child, not the run), then probed.

    python bench/ragged_diag.py [--out DIR] [--timeout-s 40] [--case "358x14070x3273:{json knobs}" ...]

Probes per case (C NaN-poisoned before each call, fp32 reference):
- ``random``: relative error; the count of wrong elements, of wrong rows of C and wrong columns,
  and the wrong rows grouped by the row's 8-halves misalignment ((row * K) % 8, A's shift) and the
  wrong columns by (col * K) % 8 (B's shift);
- ``kblock``: A zero except one 64-wide K block (the first three, the middle and the last two):
  the relative error of each, so a wrong ring slot or a wrong tail shows as one block;
- ``ones``: A and B all ones: C must be K everywhere (exact in fp16 up to 2048; beyond, within fp16 rounding).

Launches go through the evaluator's binder, as in ``align_mid_check``. Writes ``ragged_diag.json``.
Exit 1 when any case is wrong, hangs or fails to compile.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_T = {"RAGGED": 1, "SWAP": True, "EPI": "tsmem"}
_R = {"RAGGED": 1}
CASES: list[tuple[str, dict]] = [
    ("1000x3000x1001", {**_R, "BM": 128, "BN": 128, "STAGES": 2, "EPI": "direct"}),
    ("77x300x45", {**_R, "BM": 64, "BN": 64, "CONSUMERS": 1, "STAGES": 2, "RSTAGES": 4}),
    ("22x6490x2882", {**_T, "BM": 64, "BN": 24, "CONSUMERS": 1, "STAGES": 4}),
    ("358x14070x3273", {**_T, "BM": 128, "BN": 72, "STAGES": 3}),
    ("1000x3001x1006", {**_R, "BM": 128, "BN": 64, "SCHED": "pingpong", "STAGES": 2, "EPI": "smem"}),
    ("100x300x10001", {**_R, "BM": 64, "BN": 128, "CONSUMERS": 1, "STAGES": 2, "SPLIT_K": 8, "EPI": "direct"}),
    ("2000x3000x1001", {**_R, "BM": 128, "BN": 128, "STAGES": 2, "EPI": "direct", "PERSISTENT": False}),
    # a second producer warpgroup (RPRODUCERS 2): 256 producer threads, the FULL barrier's count and
    # the rows' owners change; with two consumers and with one
    ("1000x3000x1001", {**_R, "RPRODUCERS": 2, "BM": 128, "BN": 128, "STAGES": 2, "EPI": "direct"}),
    ("358x14070x3273", {**_T, "RPRODUCERS": 2, "BM": 128, "BN": 72, "STAGES": 3}),
    ("22x6490x2882", {**_T, "RPRODUCERS": 2, "BM": 64, "BN": 24, "CONSUMERS": 1, "STAGES": 4}),
    # 128 raw rows for 256 producer threads: the threads past the rows must not shift (the shift's
    # guard, keyed to 128 threads, let them write past the ring stage; found by reading, before a run)
    ("77x300x45", {**_R, "RPRODUCERS": 2, "BM": 64, "BN": 64, "CONSUMERS": 1, "STAGES": 2, "RSTAGES": 4}),
]


def _probe(shape_text: str, knobs: dict, cubin_path: str, q: Any) -> None:
    """Child process: bind the compiled case, run the probes, put a dict on ``q``."""
    import torch

    from align_mid_check import launcher
    from decode_dev import frob_error
    from evaluators.run._kernels import CandidateKernels
    from evaluators.run._loader import DriverLoader
    from evaluators.run._tmap import TmapCache
    from populations import Shape, load_templates

    torch.zeros(1, device="cuda")
    s = Shape.parse(shape_text)
    cand = load_templates()["sm90_wgmma"].candidate(knobs, s)
    launch = launcher(CandidateKernels(DriverLoader(), Path(cubin_path).read_bytes(), cand.plan, TmapCache()), s)
    m, n, k = s.m, s.n, s.k
    out: dict[str, Any] = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, k, device="cuda", dtype=torch.half, generator=g)
    b = torch.randn(n, k, device="cuda", dtype=torch.half, generator=g)
    c = torch.empty(m, n, device="cuda", dtype=torch.half)

    def run(a_: Any) -> Any:
        c.fill_(float("nan"))
        launch(a_, b, c)
        torch.cuda.synchronize()
        return a_.float() @ b.float().t()

    ref = run(a)
    out["random"] = frob_error(c, ref)
    diff = (c.float() - ref).abs()
    tol = 2e-2 * ref.abs().max().clamp(min=1.0)
    wrong = ~(diff <= tol)  # NaN counts as wrong
    rows = wrong.any(1).nonzero().flatten().tolist()
    cols = wrong.any(0).nonzero().flatten().tolist()
    out["wrong_elems"] = int(wrong.sum())
    out["wrong_rows"] = {"count": len(rows), "first": rows[:12],
                         "by_shift": {str(h): sum((r * k) % 8 == h for r in rows) for h in range(8)}}
    out["wrong_cols"] = {"count": len(cols), "first": cols[:12],
                         "by_shift": {str(h): sum((q_ * k) % 8 == h for q_ in cols) for h in range(8)}}
    nkb = -(-k // 64)
    blocks = sorted({j for j in (0, 1, 2, nkb // 2, nkb - 2, nkb - 1) if 0 <= j < nkb})
    out["kblock"] = {}
    for j in blocks:
        aj = torch.zeros_like(a)
        aj[:, 64 * j:64 * j + 64] = a[:, 64 * j:64 * j + 64]
        out["kblock"][str(j)] = round(frob_error(c, run(aj)), 6)
    ones = torch.ones_like(a)
    b.fill_(1.0)
    run(ones)
    exp = torch.tensor(float(k), dtype=torch.half).item()
    out["ones"] = {"expected": exp, "min": c.float().min().item(), "max": c.float().max().item(),
                   "nan": int((~torch.isfinite(c)).sum())}
    q.put(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--timeout-s", type=float, default=40.0)
    ap.add_argument("--case", action="append", default=None, help='"MxNxK:{json knobs}"')
    args = ap.parse_args()
    cases = [(t.split(":", 1)[0], json.loads(t.split(":", 1)[1])) for t in args.case] if args.case else CASES
    from decode_dev import compile_all
    from populations import Shape, load_templates

    t0 = time.time()
    tpl = load_templates()["sm90_wgmma"]
    cands = [tpl.candidate(kn, Shape.parse(s)) for s, kn in cases]
    compiled = compile_all(cands)
    print(f"compiled {len(compiled)} sources in {time.time() - t0:.0f} s", flush=True)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / "ragged_diag"
    tmp.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")
    results, bad = [], 0
    for i, ((s, kn), cand) in enumerate(zip(cases, cands)):
        row: dict[str, Any] = {"shape": s, "knobs": kn}
        res = compiled[cand.source]
        if not res.ok:
            row["error"] = f"compile: {res.status} {res.message[-400:]}"
        else:
            path = tmp / f"case{i}.cubin"
            path.write_bytes(res.cubin)
            q = ctx.Queue()
            p = ctx.Process(target=_probe, args=(s, kn, str(path), q))
            p.start()
            p.join(args.timeout_s)
            if p.is_alive():
                p.kill()
                p.join()
                row["error"] = f"hung past {args.timeout_s:.0f} s"
            elif q.empty():
                row["error"] = f"child exited {p.exitcode} without a result (a fault?)"
            else:
                row.update(q.get())
        ok = ("error" not in row and row["random"] < 2e-3
              and row["ones"]["min"] == row["ones"]["max"] == row["ones"]["expected"])
        bad += not ok
        row["ok"] = ok
        results.append(row)
        print(json.dumps(row), flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "ragged_diag.json").write_text(json.dumps(results, indent=1))
    print(f"{len(cases) - bad} of {len(cases)} cases right, {time.time() - t0:.0f} s")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
