//@embed _base.cu
// A 40 KiB static "swizzle table" on top of the base's 16.5 KiB tiles, and the plan adds 200 KiB
// of dynamic staging: each number is within its own limit, their sum is beyond the SM's 227 KiB.
extern "C" __global__ void __launch_bounds__(256) hgemm_big_smem(const evo_half* A, const evo_half* B, evo_half* C,
                                                                int M, int N, int K) {
    __shared__ float table[10240];
    extern __shared__ float staging[];
    for (int i = threadIdx.x; i < 10240; i += EVO_THREADS) table[i] = 0.f;
    staging[threadIdx.x] = 0.f;
    __syncthreads();
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    acc[0][0] += table[threadIdx.x] + staging[threadIdx.x];
    evo_store(C, M, N, acc);
}
