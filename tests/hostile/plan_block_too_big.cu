//@embed _base.cu
// 2048 threads per block ("more warps hide more latency"): beyond the hardware's 1024.
extern "C" __global__ void hgemm_wide_block(const evo_half* A, const evo_half* B, evo_half* C, int M, int N, int K) {
    if (threadIdx.x >= EVO_THREADS) return;
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}
