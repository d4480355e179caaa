"""Debugging bench (device): does a kernel with tensor maps by value run the same when its
arguments come as a ``void**`` array and as one parameter block (pycuda's only way)?

    python bench/pycuda_launch_check.py [--shape 256x384x512:TN] [--template sm90_wgmma]

Launches the template's heuristic pick four ways on the same operands: DriverLoader (void**),
cuda.bindings with ``extra`` = the pack's parameter block (bytes object, then a 64-byte
aligned copy), and PycudaLoader (where pycuda imports). Prints the driver's parameter offsets
(cuFuncGetParamInfo), the block's, and per way the NaN count and max error of C vs torch.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", default="256x384x512:TN")
    ap.add_argument("--template", default="sm90_wgmma")
    args = ap.parse_args()
    import torch
    from cuda.bindings import driver as drv

    from evaluators.compile._compile import compile_candidate
    from evaluators.run._loader import DriverLoader, get_loader
    from evaluators.run._tmap import ParamPack, TmapCache
    from populations import Shape, load_templates

    torch.cuda.init()
    torch.cuda.set_device(0)
    shape = Shape.parse(args.shape)
    tpl = load_templates()[args.template]
    cand = tpl.candidate(tpl.heuristic(shape)[0], shape)
    res = compile_candidate(cand, "sm_90a")
    print("compile", res.status, res.message[:200])
    launches, ws = cand.plan.resolve(shape)
    a = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.float16)
    b = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.float16)  # TN: B stored N x K
    c = torch.empty(shape.m, shape.n, device="cuda", dtype=torch.float16)
    w = torch.zeros(max(ws, 16), device="cuda", dtype=torch.uint8)
    ref = (a.float() @ b.float().t())
    ptrs = {"A": a.data_ptr(), "B": b.data_ptr(), "C": c.data_ptr(), "workspace": w.data_ptr()}
    tmaps = TmapCache()
    drvl = DriverLoader()
    module = drvl.load(res.cubin)

    def packs():
        out = []
        for ln in launches:
            pack = ParamPack(ln.args)
            maps = {name: tmaps.table(cand.plan.tensor_maps[name], shape)(ptrs[cand.plan.tensor_maps[name].matrix])
                    for name in pack.tmap_names}
            pack.fill(ptrs, maps)
            out.append((ln, pack))
        return out

    def check(way):
        torch.cuda.synchronize()
        nans = int(torch.isnan(c).sum())
        err = float((c.float() - ref).abs().nan_to_num(float("inf")).max())
        print(f"{way:<34} NaN in C: {nans:>7}   max |C - ref|: {err:.4g}")

    fns = {ln.kernel: drvl.function(module, ln.kernel, ln.smem) for ln in launches}
    for ln, pack in packs():
        print(ln.kernel, "driver param (offset, size):", drvl.param_layout(fns[ln.kernel]))
        print(ln.kernel, "natural layout:             ", pack.natural_layout())

    c.fill_(float("nan"))
    for ln, pack in packs():
        drvl.launcher(fns[ln.kernel], ln.grid, ln.block, ln.smem)(0, pack)
    check("driver, void**")

    for how in ("block", "aligned", "driver offsets", "driver offsets - first"):
        aligned = how == "aligned"
        c.fill_(float("nan"))
        for ln, pack in packs():
            blob = pack.param_buffer()
            if how.startswith("driver"):
                lay = drvl.param_layout(fns[ln.kernel])
                shift = lay[0][0] if how.endswith("first") else 0
                blob = pack.param_buffer([(at - shift, size) for at, size in lay])
            if aligned:
                store = ctypes.create_string_buffer(len(blob) + 64)
                base = (ctypes.addressof(store) + 63) & ~63
                ctypes.memmove(base, blob, len(blob))
            else:
                store = ctypes.create_string_buffer(blob, len(blob))
                base = ctypes.addressof(store)
            size = ctypes.c_size_t(len(blob))
            extra = (ctypes.c_void_p * 5)(1, base, 2, ctypes.addressof(size), 0)  # BUFFER_POINTER, BUFFER_SIZE, END
            r = drv.cuLaunchKernel(fns[ln.kernel], *ln.grid, *ln.block, ln.smem, drv.CUstream(0), 0,
                                   ctypes.addressof(extra))
            if int(r[0]) != 0:
                print("cuLaunchKernel(extra) failed:", r[0])
        check(f"cuda.bindings, {how}")

    try:
        pyl = get_loader("pycuda")
    except Exception as exc:
        print("pycuda:", exc)
        return 0
    pmod = pyl.load(res.cubin)
    c.fill_(float("nan"))
    for ln, pack in packs():
        pyl.launcher(pyl.function(pmod, ln.kernel, ln.smem), ln.grid, ln.block, ln.smem)(0, pack)
    check("pycuda, parameter block")
    return 0


if __name__ == "__main__":
    sys.exit(main())
