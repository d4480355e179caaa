"""Device-side check and timing of the sm90_wgmma template (family B) against torch.matmul.

Run on an H200: ``PYTHONUNBUFFERED=1 python3 bench/wgmma_check.py --out $OUT``.

What it does, in child processes so that a trapped or hung kernel costs one job, not the run:
1. correctness: each knob variant x layout x ragged shape, compiled with NVRTC for sm_90a (a
   deadlocked mbarrier wait hangs its child, which the job timeout kills: the template no longer
   carries a clock-based watchdog, since candidates may not read clocks), launched through cuda.bindings on torch's
   stream with torch-owned buffers and TMA maps encoded as contracts.md §1 says; C is poisoned with
   NaN first; relative Frobenius error against a float32 reference must be < 1e-2;
2. timing: CUDA-graph replays of back-to-back launches over rotating buffer sets larger than
   2 x the 60 MB L2, median over many replays, paired with torch.matmul on the same buffers.
It prints a compact table last and writes ``wgmma_check.json`` and ``wgmma_check.log`` under --out.

This is a development bench with its own minimal launcher; the evaluators' GPU worker is the
harness of record.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from populations import Shape  # noqa: E402
from populations import load_template  # noqa: E402
from evaluators.run._loader import nvrtc_cubin  # noqa: E402

TEMPLATE_DIR = ROOT / "populations" / "templates" / "sm90_wgmma"
L2_BYTES = 60 * 2**20
CHILD_RESTART = 3  # a child's exit code after it reported a failed job

# name -> (knobs, extra #defines)
_PP = {"SCHED": "pingpong", "CONSUMERS": 2}
_SMEM = {"EPI": "smem"}
_CL2 = {"CLUSTER_M": 2}
VARIANTS: dict[str, tuple[dict, tuple[str, ...]]] = {
    # run 2's baselines (coop: both consumers split each tile)
    "t128x256_s4": ({"BM": 128, "BN": 256, "STAGES": 4, "CONSUMERS": 2}, ()),
    "t128x256_s3": ({"BM": 128, "BN": 256, "STAGES": 3, "CONSUMERS": 2}, ()),
    "t128x128_s6": ({"BM": 128, "BN": 128, "STAGES": 6, "CONSUMERS": 2}, ()),
    "t64x128_c1": ({"BM": 64, "BN": 128, "STAGES": 7, "CONSUMERS": 1}, ()),
    # shared-memory epilogue, pingpong consumers, 2-CTA clusters with B multicast
    "t128x256_s3_smem": ({"BM": 128, "BN": 256, "STAGES": 3, **_SMEM}, ()),
    "pp128x128_s6": ({"BM": 128, "BN": 128, "STAGES": 6, **_PP}, ()),
    "pp128x128_s4_smem": ({"BM": 128, "BN": 128, "STAGES": 4, **_PP, **_SMEM}, ()),
    "pp64x256_s5": ({"BM": 64, "BN": 256, "STAGES": 5, **_PP}, ()),
    "t128x256_s4_cl2": ({"BM": 128, "BN": 256, "STAGES": 4, **_CL2}, ()),
    "t128x256_s3_cl2": ({"BM": 128, "BN": 256, "STAGES": 3, **_CL2}, ()),
    "t128x256_s3_cl2_smem": ({"BM": 128, "BN": 256, "STAGES": 3, **_CL2, **_SMEM}, ()),
    "t128x256_np_cl2": ({"BM": 128, "BN": 256, "STAGES": 4, "PERSISTENT": False, **_CL2}, ()),
    "pp128x128_s6_cl2": ({"BM": 128, "BN": 128, "STAGES": 6, **_PP, **_CL2}, ()),
    "pp128x128_s4_cl2_smem": ({"BM": 128, "BN": 128, "STAGES": 4, **_PP, **_CL2, **_SMEM}, ()),
    "pp128x128_s6_rN": ({"BM": 128, "BN": 128, "STAGES": 6, "RASTER": "N", **_PP}, ()),
}
NN_SWAP = ("#define EVO_NN_DESC_SWAP 1",)  # alternative LBO/SBO reading for MN-major B
CHECK_SHAPES = [(129, 257, 64), (1000, 1000, 1000), (77, 4096, 4096), (128, 128, 64), (1, 8, 8),
                (33, 72, 40), (256, 512, 128), (300, 200, 2048), (2048, 2048, 8192),
                (2000, 3000, 520), (4000, 1000, 96)]  # the last two: many ragged tiles per CTA
TIME_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (8192, 8192, 1024), (2048, 2048, 8192),
               (1024, 1024, 1024), (77, 4096, 4096), (4096, 4096, 1024)]


# ------------------------------------------------------------------------------ building
def render(variant: str, layout: str, watchdog: bool) -> tuple[str, object]:
    """(source, plan) of a variant; rendered at a proxy shape (the source is shape-generic)."""
    knobs, extra = VARIANTS[variant.removesuffix("+swap")]
    if variant.endswith("+swap"):
        extra = extra + NN_SWAP
    tpl = load_template(TEMPLATE_DIR)
    source, plan = tpl.render(knobs, Shape(4096, 4096, 4096, layout, "f32"))
    pre = list(extra)  # ``watchdog`` is kept for the call sites; the template has none any more
    return "\n".join(pre) + "\n" + source, plan


def timed_cubin(source: str) -> tuple[bytes, float]:
    """sm_90a cubin through the evaluator's NVRTC helper, and the seconds it took."""
    t0 = time.perf_counter()
    return nvrtc_cubin(source, "sm_90a"), time.perf_counter() - t0


# ------------------------------------------------------------------------------ launching
class Kernel:
    """A loaded candidate: module, function, plan; launches on torch's current stream."""

    def __init__(self, cubin: bytes, plan) -> None:
        from cuda.bindings import driver as cu

        self.cu = cu
        self.plan = plan
        self.module = _ck(cu.cuModuleLoadData(cubin))[0]
        self.launches = []
        for launch in plan.launches:
            fn = _ck(cu.cuModuleGetFunction(self.module, launch.kernel.encode()))[0]
            self.launches.append(fn)

    def bind(self, shape: Shape, A, B, C):
        """A zero-argument callable launching the plan for one buffer set (maps encoded once)."""
        cu = self.cu
        resolved, workspace = self.plan.resolve(shape)
        assert workspace == 0
        maps = {name: encode_tmap(cu, {"A": A, "B": B, "C": C}[spec.matrix], spec)
                for name, spec in self.plan.tensor_maps.items()}
        calls = []
        for fn, rl in zip(self.launches, resolved):
            if rl.smem > 48 * 1024:
                _ck(cu.cuFuncSetAttribute(fn, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, rl.smem))
            keep, addrs = [], []
            for a in rl.args:
                if isinstance(a, tuple):
                    tm = maps[a[1]]
                    keep.append(tm)
                    addrs.append(tm.getPtr())
                elif a in ("A", "B", "C"):
                    v = ctypes.c_uint64({"A": A, "B": B, "C": C}[a].data_ptr())
                    keep.append(v)
                    addrs.append(ctypes.addressof(v))
                else:
                    v = ctypes.c_int32(int(a))
                    keep.append(v)
                    addrs.append(ctypes.addressof(v))
            params = (ctypes.c_void_p * len(addrs))(*addrs)
            keep.append(params)
            calls.append((fn, rl.grid, rl.block, rl.smem, params, keep))

        def run() -> None:
            import torch

            stream = cu.CUstream(torch.cuda.current_stream().cuda_stream)
            for fn, grid, block, smem, params, _keep in calls:
                _ck(cu.cuLaunchKernel(fn, *grid, *block, smem, stream, ctypes.addressof(params), 0))
        return run


def encode_tmap(cu, tensor, spec):
    rows, cols = tensor.shape
    box_rows, box_cols = spec.box
    sw = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}[spec.swizzle]
    return _ck(cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, tensor.data_ptr(),
        [cu.cuuint64_t(cols), cu.cuuint64_t(rows)], [cu.cuuint64_t(cols * 2)],
        [cu.cuuint32_t(box_cols), cu.cuuint32_t(box_rows)], [cu.cuuint32_t(1), cu.cuuint32_t(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(cu.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{sw}"),
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))[0]


def _ck(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")
    return rest


def make_operands(shape: Shape, gen=None):
    import torch

    a = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.float16, generator=gen)
    if shape.layout == "TN":
        b = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.float16, generator=gen)
    else:
        b = torch.randn(shape.k, shape.n, device="cuda", dtype=torch.float16, generator=gen)
    c = torch.full((shape.m, shape.n), float("nan"), device="cuda", dtype=torch.float16)
    return a, b, c


def torch_mm(shape: Shape, a, b, c):
    import torch

    bb = b.t() if shape.layout == "TN" else b
    return lambda: torch.matmul(a, bb, out=c)


# ------------------------------------------------------------------------------ child jobs
def job_check(variant: str, layout: str) -> dict:
    import torch

    source, plan = render(variant, layout, watchdog=True)
    cubin, secs = timed_cubin(source)
    k = Kernel(cubin, plan)
    out = {"job": "check", "variant": variant, "layout": layout, "compile_s": round(secs, 2), "shapes": []}
    ok_all = True
    for m, n, kk in CHECK_SHAPES:
        if kk % 8 or (layout == "NN" and n % 8):
            continue  # outside what TMA can describe (the template's constraints say so too)
        shape = Shape(m, n, kk, layout, "f32")
        a, b, c = make_operands(shape)
        k.bind(shape, a, b, c)()
        torch.cuda.synchronize()
        ref = a.float() @ (b.float().t() if layout == "TN" else b.float())
        nan = int(torch.isnan(c).sum())
        err = float((c.float() - ref).norm() / ref.norm()) if nan == 0 else float("nan")
        ok = nan == 0 and err < 1e-2
        # a second draw of fresh inputs catches stale-state bugs
        if ok:
            a.normal_(); b.normal_(); c.fill_(float("nan"))
            k.bind(shape, a, b, c)()
            torch.cuda.synchronize()
            ref = a.float() @ (b.float().t() if layout == "TN" else b.float())
            err2 = float((c.float() - ref).norm() / ref.norm())
            ok = bool(torch.isfinite(c).all()) and err2 < 1e-2
            err = max(err, err2)
        ok_all &= ok
        rec = {"shape": [m, n, kk], "ok": ok, "rel_err": err, "nan": nan}
        if not ok:  # where it goes wrong, for debugging without another device call
            bad = ~torch.isfinite(c) | ((c.float() - ref).abs() > 0.05 * ref.abs().max())
            idx = bad.nonzero()
            rec["bad_frac"] = float(bad.float().mean())
            rec["first_bad"] = idx[:4].tolist()
            rec["bad_rows"] = sorted(set((idx[:, 0] % 128).tolist()))[:40]
            rec["bad_cols"] = sorted(set((idx[:, 1] % 256).tolist()))[:40]
        out["shapes"].append(rec)
    out["ok"] = ok_all
    return out


def bench_graph(fns, flops: float, reps_target_ms: float = 25.0) -> float:
    """Median seconds per launch over CUDA-graph replays of back-to-back launches of ``fns`` (rotating)."""
    import torch

    est = flops / 600e12 + 5e-6
    reps = max(len(fns), min(400, int(reps_target_ms * 1e-3 / est)))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fns:
            f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(reps):
            fns[i % len(fns)]()
    g.replay()
    torch.cuda.synchronize()
    times = []
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(15):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e-3 / reps)
    del g
    return statistics.median(times)


def job_time(variants: list[str], layout: str) -> dict:
    import torch

    kernels = {}
    for v in variants:
        source, plan = render(v, layout, watchdog=False)
        kernels[v] = Kernel(timed_cubin(source)[0], plan)
    rows = []
    for m, n, kk in TIME_SHAPES:
        if kk % 8 or (layout == "NN" and n % 8):
            continue
        shape = Shape(m, n, kk, layout, "f32")
        set_bytes = 2 * (m * kk + kk * n + m * n)
        nsets = max(2, min(64, -(-2 * L2_BYTES // set_bytes) + 1))
        sets = [make_operands(shape) for _ in range(nsets)]
        flops = 2.0 * m * n * kk
        row = {"shape": [m, n, kk], "layout": layout, "sets": nsets}
        t_ref = [bench_graph([torch_mm(shape, *s) for s in sets], flops)]
        for v, k in kernels.items():
            try:
                fns = [k.bind(shape, *s) for s in sets]
                row[v] = bench_graph(fns, flops)
            except Exception as exc:  # record and go on
                row[v] = None
                row[v + "_error"] = repr(exc)[:300]
        t_ref.append(bench_graph([torch_mm(shape, *s) for s in sets], flops))
        row["torch"] = statistics.median(t_ref)
        row["torch_spread"] = [min(t_ref), max(t_ref)]
        rows.append(row)
        print(json.dumps(row), flush=True)
        del sets
        torch.cuda.empty_cache()
    return {"job": "time", "layout": layout, "rows": rows}


def child_main(args) -> None:
    import torch
    from cuda.bindings import driver as cu

    torch.manual_seed(1234)
    torch.zeros(1, device="cuda")           # torch makes the primary context current ...
    torch.cuda.synchronize()
    _ck(cu.cuInit(0))                        # ... and the driver API then works in it
    spec = json.loads(args.child)
    for j in spec["jobs"]:
        try:
            res = job_check(j["variant"], j["layout"]) if j["kind"] == "check" else job_time(j["variants"], j["layout"])
        except Exception as exc:
            res = {"job": j["kind"], **j, "ok": False, "error": repr(exc)[:2000]}
            print("RESULT " + json.dumps(res), flush=True)
            sys.exit(CHILD_RESTART)          # the context may be poisoned: start afresh
        print("RESULT " + json.dumps(res), flush=True)


# ------------------------------------------------------------------------------ parent
def run_jobs(jobs: list[dict], log, timeout: float) -> list[dict]:
    """Run jobs in a child; when it dies (trap, hang), record the job and restart after it."""
    import queue
    import threading

    results: list[dict] = []
    todo = list(jobs)
    while todo:
        t0 = time.time()
        proc = subprocess.Popen([sys.executable, __file__, "--child", json.dumps({"jobs": todo})],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: "queue.Queue[str | None]" = queue.Queue()

        def pump() -> None:
            for line in proc.stdout:  # type: ignore[union-attr]
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        done = 0
        while True:
            left = timeout - (time.time() - t0)
            try:
                line = lines.get(timeout=max(0.1, left))
            except queue.Empty:
                line = None
            if line is None:
                if left <= 0 or proc.poll() is None:
                    proc.kill()
                break
            log.write(line)
            log.flush()
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
                results.append(res)
                done += 1
                print(_short(res), flush=True)
        proc.wait()
        if done < len(todo) and proc.returncode != CHILD_RESTART:
            failed = todo[done]
            results.append({"job": failed["kind"], **failed, "ok": False,
                            "error": f"child died (rc={proc.returncode}) or timed out after {time.time() - t0:.0f} s"})
            print(_short(results[-1]), flush=True)
            done += 1
        todo = todo[done:]
    return results


def _short(res: dict) -> str:
    if res.get("job") == "check":
        bad = [(s["shape"], s.get("bad_frac"), s.get("first_bad"), s.get("bad_rows"), s.get("bad_cols"))
               for s in res.get("shapes", []) if not s["ok"]][:2]
        worst = max((s["rel_err"] for s in res.get("shapes", []) if s["ok"]), default=float("nan"))
        return (f"check {res.get('variant')} {res.get('layout')}: {'OK' if res.get('ok') else 'FAIL'}"
                f" worst={worst:.2e} bad={bad} {res.get('error', '')[:300]}")
    return f"time {res.get('layout')}: {len(res.get('rows', []))} shapes {res.get('error', '')[:300]}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--variants", default=None, help="comma-separated variant names (default: all)")
    ap.add_argument("--nn-variants", default="t128x256_s3_smem,pp128x128_s4_smem,t128x256_s4_cl2,pp128x128_s4_cl2_smem")
    ap.add_argument("--no-time", action="store_true")
    args = ap.parse_args()
    if args.child:
        child_main(args)
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = args.variants.split(",") if args.variants else list(VARIANTS)
    nn = args.nn_variants.split(",") if args.nn_variants else []
    t_start = time.time()
    with open(out / "wgmma_check.log", "w") as log:
        checks = [{"kind": "check", "variant": v, "layout": "TN"} for v in variants]
        checks += [{"kind": "check", "variant": v, "layout": "NN"} for v in nn]
        checks += [{"kind": "check", "variant": v + "+swap", "layout": "NN"} for v in nn[:1]]
        results = run_jobs(checks, log, timeout=150)
        good = {(r["variant"], r["layout"]) for r in results if r.get("ok")}
        timing = []
        if not args.no_time:
            for layout in ("TN", "NN"):
                cands = variants if layout == "TN" else nn + [v + "+swap" for v in nn[:1]]
                vs = [v for v in cands if (v, layout) in good]
                if vs:
                    timing += run_jobs([{"kind": "time", "variants": vs, "layout": layout}], log, timeout=170)
    summary = {"checks": results, "timing": timing, "seconds": time.time() - t_start}
    (out / "wgmma_check.json").write_text(json.dumps(summary, indent=1))
    print_table(results, timing)
    return 0


def print_table(results: list[dict], timing: list[dict]) -> None:
    print("\n== correctness (rel. Frobenius error vs fp32; NaN-poisoned C) ==")
    for r in results:
        print("  " + _short(r))
    for t in timing:
        for row in t.get("rows", []):
            m, n, k = row["shape"]
            tt = row["torch"]
            best = min(((v, s) for v, s in row.items() if (v in VARIANTS or v.endswith("+swap")) and s),
                       key=lambda vs: vs[1], default=(None, None))
            cells = []
            for v, s in row.items():
                if (v in VARIANTS or v.endswith("+swap")) and s:
                    cells.append(f"{v}={2*m*n*k/s/1e12:.0f}T/{tt/s:.2f}x")
            print(f"{row['layout']} {m}x{n}x{k}: torch {2*m*n*k/tt/1e12:.0f} TFLOP/s ({tt*1e6:.1f} us); "
                  f"best {best[0]} {tt/best[1] if best[1] else 0:.3f}x | " + " ".join(cells))


if __name__ == "__main__":
    sys.exit(main())
