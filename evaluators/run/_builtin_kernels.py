"""Header-free CUDA sources the evaluator owns: the health-probe kernel, a naive reference GEMM
and its deliberately broken variants (for the GPU tests and the benchmark's fallback set).

No ``#include``: fp16 conversions are inline PTX, so NVRTC needs no toolkit headers.
"""
from __future__ import annotations

from populations import Candidate, LaunchPlan, Shape, Status

__all__ = ["NAIVE_GEMM", "naive_plan", "naive_candidate", "BUGS", "EMPTY_KERNEL"]

NAIVE_GEMM = r"""
__device__ __forceinline__ float evo_h2f(unsigned short h) {
    float f; asm("{ .reg .f16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h)); return f;
}
__device__ __forceinline__ unsigned short evo_f2h(float f) {
    unsigned short h; asm("{ .reg .f16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f)); return h;
}
extern "C" __global__ void evo_empty() {}
extern "C" __global__ void evo_naive_gemm(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
                                          unsigned short* __restrict__ C, int M, int N, int K) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
#ifdef EVO_BUG_HANG
    if (K > 0) { while (true) { __nanosleep(1000); } }
#endif
    if (i >= M || j >= N) return;
#ifdef EVO_BUG_ILLEGAL
    if (i == M - 1 && j == N - 1) { *(volatile unsigned short*)(C + ((size_t)1 << 40)) = 0; }
#endif
#ifdef EVO_BUG_MODIFY_INPUT
    if (i == 0 && j == 0) { ((unsigned short*)A)[0] = 0; }
#endif
    float acc = 0.f;
#ifdef EVO_BUG_SKIP_LAST_K
    const int kend = K - 1;
#else
    const int kend = K;
#endif
    for (int k = 0; k < kend; ++k) {
#ifdef EVO_LAYOUT_NN
        float p = evo_h2f(A[(size_t)i * K + k]) * evo_h2f(B[(size_t)k * N + j]);
#else
        float p = evo_h2f(A[(size_t)i * K + k]) * evo_h2f(B[(size_t)j * K + k]);
#endif
#ifdef EVO_BUG_FP16_ACC
        acc = evo_h2f(evo_f2h(acc + p));
#else
        acc += p;
#endif
    }
#ifdef EVO_BUG_OOB_WRITE
    if (i == M - 1 && j == N - 1) { C[(size_t)M * N + 7] = evo_f2h(acc); }
#endif
    C[(size_t)i * N + j] = evo_f2h(acc);
}
#ifdef EVO_BUG_WS_CACHE
// Caches every output element in the workspace with a per-element tag: right on a fresh (0xFF)
// workspace, stale once the workspace persists across calls (the harness's timing sets do).
extern "C" __global__ void evo_cached_gemm(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
                                           unsigned short* __restrict__ C, unsigned char* __restrict__ W,
                                           int M, int N, int K) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    int i = blockIdx.y * blockDim.y + threadIdx.y;
    if (i >= M || j >= N) return;
    size_t idx = (size_t)i * N + j;
    unsigned int* tags = (unsigned int*)W;
    unsigned short* cache = (unsigned short*)(W + (size_t)M * N * 4);
    if (tags[idx] == 0xC0FFEEu) { C[idx] = cache[idx]; return; }
    float acc = 0.f;
    for (int k = 0; k < K; ++k) {
#ifdef EVO_LAYOUT_NN
        acc += evo_h2f(A[(size_t)i * K + k]) * evo_h2f(B[(size_t)k * N + j]);
#else
        acc += evo_h2f(A[(size_t)i * K + k]) * evo_h2f(B[(size_t)j * K + k]);
#endif
    }
    C[idx] = cache[idx] = evo_f2h(acc);
    tags[idx] = 0xC0FFEEu;
}
#endif
"""

EMPTY_KERNEL = "evo_empty"

#: bug macro -> the status the evaluator must give it
BUGS: dict[str, Status] = {
    "EVO_BUG_FP16_ACC": Status.INCORRECT,
    "EVO_BUG_SKIP_LAST_K": Status.INCORRECT,
    "EVO_BUG_OOB_WRITE": Status.INCORRECT,
    "EVO_BUG_MODIFY_INPUT": Status.INCORRECT,
    "EVO_BUG_ILLEGAL": Status.RUNTIME_ERROR,
    "EVO_BUG_HANG": Status.TIMEOUT,
    "EVO_BUG_WS_CACHE": Status.FLAGGED,  # passes correctness; the after-timing recheck exposes it
}


def naive_plan(tile: int = 16, workspace_cache: bool = False) -> LaunchPlan:
    if workspace_cache:
        return LaunchPlan.from_dict({"workspace": "M * N * 6", "launches": [{
            "kernel": "evo_cached_gemm", "grid": [f"cdiv(N, {tile})", f"cdiv(M, {tile})", 1],
            "block": [tile, tile, 1], "smem": 0, "args": ["A", "B", "C", "workspace", "M", "N", "K"]}]})
    return LaunchPlan.from_dict({"launches": [{
        "kernel": "evo_naive_gemm", "grid": [f"cdiv(N, {tile})", f"cdiv(M, {tile})", 1],
        "block": [tile, tile, 1], "smem": 0, "args": ["A", "B", "C", "M", "N", "K"]}]})


def naive_candidate(shapes: tuple[Shape, ...], *, bug: str = "", generic: bool = False, tile: int = 16) -> Candidate:
    """The naive GEMM (or one of its :data:`BUGS`) as a candidate for ``shapes`` (one layout)."""
    layout = shapes[0].layout
    header = f"#define EVO_LAYOUT_{layout} 1\n" + (f"#define {bug} 1\n" if bug else "")
    plan = naive_plan(tile, workspace_cache=bug == "EVO_BUG_WS_CACHE")
    return Candidate(source=header + NAIVE_GEMM, plan=plan, shapes=tuple(shapes), generic=generic,
                     operator="builtin", meta={"bug": bug} if bug else {})
