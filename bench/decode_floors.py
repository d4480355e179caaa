"""What a decode kernel cannot beat on the GPU it runs on (issue 26, target 3): an empty kernel and a
pure streaming read of the same weight bytes, both timed like the kernels (CUDA-graph replay over
rotating operand sets > 3x L2, medians), for bench/decode_dev.py.

The read kernel is the weight stream and nothing else: 16-byte ``ld.global.nc.L1::no_allocate``
loads, UNROLL of them in flight per thread before any use, a grid-stride loop over the bytes, one
XOR per thread folded into a word that is stored only when it equals a value the data never gives
(so the loads cannot be removed and nothing is written). Best of a few launch shapes. The gap
between it and a decode kernel on the same bytes is what the kernel's own work costs; the gap
between it and bytes / 4.5 TB/s is launch plus ramp-up, which no kernel avoids.
"""
from __future__ import annotations

from typing import Any, Callable

SRC = r"""
extern "C" __global__ void evo_floor_empty() {}

template <int UNROLL>
__device__ __forceinline__ void stream(const uint4* __restrict__ p, long long n16, unsigned int* sink) {
  unsigned int x = 0u;
  const long long stride = (long long)gridDim.x * blockDim.x;
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + (UNROLL - 1) * stride < n16; i += UNROLL * stride) {
    uint4 v[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * stride));
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) x ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) { const uint4 v = p[i]; x ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (x == 0x7fc00001u) *sink = x;  // a NaN pattern randn halves never XOR to in practice: keeps the loads
}
extern "C" __global__ void evo_floor_read4(const uint4* p, long long n16, unsigned int* sink) { stream<4>(p, n16, sink); }
extern "C" __global__ void evo_floor_read8(const uint4* p, long long n16, unsigned int* sink) { stream<8>(p, n16, sink); }
"""
# (kernel, threads per block, blocks per SM)
READ_CONFIGS = [("evo_floor_read4", 512, 4), ("evo_floor_read8", 256, 8), ("evo_floor_read8", 512, 4),
                ("evo_floor_read4", 1024, 2), ("evo_floor_read8", 1024, 2)]


class Floors:
    """Compiled floor kernels; ``empty_us`` and ``read_us`` time them over a rotation's weights."""

    def __init__(self) -> None:
        import cupy as cp
        import torch

        self.cp, self.torch = cp, torch
        self.module = cp.RawModule(code=SRC, options=("-std=c++17",), name_expressions=None)
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count
        self.sink = torch.zeros(1, dtype=torch.int32, device="cuda")

    def _launch(self, name: str, grid: int, block: int, args: tuple) -> None:
        fn = self.module.get_function(name)
        with self.cp.cuda.ExternalStream(self.torch.cuda.current_stream().cuda_stream):
            fn((grid,), (block,), args)

    def empty_us(self, sets: list, graph_us: Callable[[list, Callable], float]) -> float:
        """One empty launch per rotation set, graph-replayed: the launch floor inside a graph."""
        return graph_us(sets, lambda a, w, c: self._launch("evo_floor_empty", 1, 32, ()))

    def read_launcher(self, cfg: tuple[str, int, int]) -> Callable[[Any, Any, Any], None]:
        """launch(a, w, c) streaming w's bytes with one of ``READ_CONFIGS`` (kernel, threads, blocks per SM)."""
        name, threads, per_sm = cfg

        def launch(a: Any, w: Any, c: Any) -> None:
            n16 = w.numel() * 2 // 16
            self._launch(name, self.sms * per_sm, threads, (w.data_ptr(), self.cp.int64(n16), self.sink.data_ptr()))
        return launch

    def best_read(self, sets: list, graph_us: Callable[[list, Callable], float]
                  ) -> tuple[float, str, Callable[[Any, Any, Any], None]]:
        """The fastest streaming read of each set's weights (w): us, its launch shape, its launcher."""
        best: tuple[float, str, Callable[[Any, Any, Any], None]] = (float("inf"), "", lambda a, w, c: None)
        for name, threads, per_sm in READ_CONFIGS:
            launch = self.read_launcher((name, threads, per_sm))
            t = graph_us(sets, launch)
            if t < best[0]:
                best = (t, f"{name[-5:]}x{threads}x{per_sm}", launch)
        return best

    def read_us(self, sets: list, graph_us: Callable[[list, Callable], float]) -> tuple[float, str]:
        """Best streaming read of each set's weights (w), us and the launch shape that gave it."""
        t, label, _ = self.best_read(sets, graph_us)
        return t, label
