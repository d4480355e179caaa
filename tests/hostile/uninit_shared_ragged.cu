//@embed _base.cu
// Bounds-checked loads that skip out-of-range elements instead of writing zeros: at a ragged K
// the last k-tile multiplies whatever the previous tile (or a previous kernel) left in shared memory.
extern "C" __global__ void __launch_bounds__(256) hgemm_lazy_fill(const evo_half* A, const evo_half* B, evo_half* C,
                                                                 int M, int N, int K) {
    __shared__ float As[EVO_BM][EVO_BK + 1];
    __shared__ float Bs[EVO_BN][EVO_BK + 1];
    const int m0 = blockIdx.y * EVO_BM, n0 = blockIdx.x * EVO_BN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += EVO_BK) {
        for (int i = threadIdx.x; i < EVO_BM * EVO_BK; i += EVO_THREADS) {
            int r = i / EVO_BK, c = i % EVO_BK, gk = k0 + c;
            if (gk < K) {
                As[r][c] = m0 + r < M ? evo_h2f(A[(size_t)(m0 + r) * K + gk]) : 0.f;
                Bs[r][c] = n0 + r < N ? evo_h2f(B[(size_t)(n0 + r) * K + gk]) : 0.f;
            }
        }
        __syncthreads();
        evo_tile_fma(As, Bs, acc);
        __syncthreads();
    }
    evo_store(C, M, N, acc);
}
