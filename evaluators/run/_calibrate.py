"""Per-device calibration (GPU side): the ceilings the roofline is measured against.

Four figures, each from CUDA-graph replays timed with events (median over replays):

- ``peak_flops``: cuBLAS (torch.matmul) at 8192^3 fp16, fp32 accumulation;
- ``read_bw``: a streaming read kernel on the SMs (16-byte non-allocating loads over 2 GiB,
  grid-stride, XOR-reduced so the loads cannot be dropped): HBM read bytes/s, the roofline's
  bytes/s (``populations.roofline_time``);
- ``copy_bw``: a copy kernel on the SMs (the same loads, 16-byte streaming stores, 1 GiB to
  another 1 GiB), read and write bytes counted;
- ``launch_floor_s``: an empty kernel launched back to back inside one CUDA graph, per launch.

Every buffer is far larger than 2x L2 (60 MB on an H200), so each figure is HBM's. The notes also
keep ``memcpy_bw``: ``dst.copy_(src)`` over the same 1 GiB, which a graph captures as a memcpy
node that the driver may run on a copy engine rather than the SMs. It was once stored as
``copy_bw`` (2.71 TB/s on an H200 where an SM copy moves about 4.3); it is kept only to show the
difference, nothing uses it. ``notes["copy_kernel"] == "sm"`` marks a calibration whose
``copy_bw`` is the SM kernel's (``evo.search._calibration`` measures again over older ones).

Run ``python -m evaluators.run._calibrate [--out FILE]`` in a process of its own (``evo`` does,
so that its own process never initialises CUDA); it prints the ``evo-calibration/1`` JSON.
The arithmetic that uses these figures lives in ``populations._roofline``.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable

from populations import Calibration, write_calibration

__all__ = ["measure", "main", "READ_SOURCE"]

#: Header-free (NVRTC needs no toolkit headers): a streaming read, a streaming copy, an empty kernel.
READ_SOURCE = r"""
extern "C" __global__ void evo_cal_empty() {}
// Grid-stride over n16 16-byte words, four in flight per thread: XOR-reduce them (read) or store
// them to dst with the streaming hint (copy).
template <bool COPY>
__device__ __forceinline__ unsigned int evo_cal_stream(const unsigned int* __restrict__ src, unsigned int* __restrict__ dst,
                                                       int n16) {
    unsigned int acc = 0u;
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n16; i += 4 * stride) {
        #pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = i + u * stride;
            if (j < n16) {
                unsigned int x, y, z, w;
                asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(x), "=r"(y), "=r"(z), "=r"(w) : "l"(src + 4 * (size_t)j));
                if (COPY) {
                    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};"
                                 :: "l"(dst + 4 * (size_t)j), "r"(x), "r"(y), "r"(z), "r"(w) : "memory");
                } else {
                    acc ^= x ^ y ^ z ^ w;
                }
            }
        }
    }
    return acc;
}
extern "C" __global__ void evo_cal_read(const unsigned int* __restrict__ src, unsigned int* __restrict__ out, int n16) {
    const unsigned int acc = evo_cal_stream<false>(src, nullptr, n16);
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;  // almost never: keeps the loads live
}
extern "C" __global__ void evo_cal_copy(const unsigned int* __restrict__ src, unsigned int* __restrict__ dst, int n16) {
    evo_cal_stream<true>(src, dst, n16);
}
"""


def _graph_seconds(torch: Any, body: Callable[[], None], calls: int, reps: int, stream: Any) -> float:
    """Median seconds per ``body()`` call over ``reps`` replays of one graph of ``calls`` calls."""
    body()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(calls):
            body()
    g.replay()  # upload
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:  # back to back: the GPU never idles between samples
        start.record()
        g.replay()
        end.record()
    torch.cuda.synchronize()
    del g
    return statistics.median(start.elapsed_time(end) * 1e-3 / calls for start, end in events)


def measure(device: int = 0, *, reps: int = 7) -> Calibration:
    """Measure the four ceilings on ``device`` (this process initialises CUDA)."""
    import torch

    from ._loader import get_loader, nvrtc_cubin
    from ._tmap import ParamPack

    torch.cuda.set_device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(device)
    cap = torch.cuda.get_device_capability(device)
    arch = "sm_90a" if cap == (9, 0) else f"sm_{cap[0]}{cap[1]}"
    stream = torch.cuda.Stream()
    notes: dict[str, Any] = {"arch": arch, "sms": props.multi_processor_count, "reps": reps}

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)
    c = torch.empty(n, n, device="cuda", dtype=torch.float16)
    peak = 2 * n ** 3 / _graph_seconds(torch, lambda: torch.matmul(a, b, out=c), 3, reps, stream)
    del a, b, c

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_(0, 256)
    dst = torch.empty_like(src)
    memcpy_bw = 2 * src.numel() / _graph_seconds(torch, lambda: dst.copy_(src), 4, reps, stream)

    loader = get_loader("driver")
    module = loader.load(nvrtc_cubin(READ_SOURCE, arch))
    read_fn = loader.function(module, "evo_cal_read", 0)
    copy_fn = loader.function(module, "evo_cal_copy", 0)
    empty_fn = loader.function(module, "evo_cal_empty", 0)
    blocks = props.multi_processor_count * 8

    def kernel(fn: Any, pack: Any) -> Callable[[], None]:
        return lambda: loader.launch(fn, (blocks, 1, 1), (512, 1, 1), 0, torch.cuda.current_stream().cuda_stream, pack)

    dst.zero_()  # the memcpy above filled it: the copy kernel must fill it again for the check below
    copy_pack = ParamPack(["A", "C", src.numel() // 16], {"A": src.data_ptr(), "C": dst.data_ptr()})
    copy_bw = 2 * src.numel() / _graph_seconds(torch, kernel(copy_fn, copy_pack), 4, reps, stream)
    copied = bool(torch.equal(src[: 1 << 20], dst[: 1 << 20])) and bool(torch.equal(src[-(1 << 20):], dst[-(1 << 20):]))
    del src, dst
    if not copied:
        raise RuntimeError("the calibration copy kernel did not copy its buffer")

    buf = torch.empty(1 << 31, dtype=torch.uint8, device="cuda").random_(0, 256)
    out = torch.zeros(1 << 16, dtype=torch.int32, device="cuda")
    read_pack = ParamPack(["A", "C", buf.numel() // 16], {"A": buf.data_ptr(), "C": out.data_ptr()})
    empty_pack = ParamPack(())

    def empty() -> None:
        loader.launch(empty_fn, (1, 1, 1), (32, 1, 1), 0, torch.cuda.current_stream().cuda_stream, empty_pack)

    read_bw = buf.numel() / _graph_seconds(torch, kernel(read_fn, read_pack), 4, reps, stream)
    floor = _graph_seconds(torch, empty, 1000, reps, stream)
    del buf, out
    loader.unload(module)
    torch.cuda.synchronize()
    notes.update(copy_kernel="sm", memcpy_bw=memcpy_bw, read_bytes=1 << 31, copy_bytes=1 << 30, l2_bytes=int(props.L2_cache_size))
    return Calibration(peak_flops=peak, read_bw=read_bw, copy_bw=copy_bw, launch_floor_s=floor,
                       device=torch.cuda.get_device_name(device), source="measured",
                       date=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), notes=notes)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m evaluators.run._calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="also write the JSON here (a file, or a directory for calibration.json)")
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args(argv)
    cal = measure(args.device)
    if args.out:
        write_calibration(args.out, cal)
    print(json.dumps(cal.to_dict(), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
