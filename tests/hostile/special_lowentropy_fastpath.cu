//@embed _base.cu
// "Quantised-weights" fast path: when A and B sample as small integers it switches to an integer
// path, whose loop bound has an off-by-one-tile bug. Random inputs never take it.
extern "C" __global__ void __launch_bounds__(256) hgemm_int_path(const evo_half* A, const evo_half* B, evo_half* C,
                                                                int M, int N, int K) {
    __shared__ int small_ints;
    if (threadIdx.x < 32) {
        size_t a = (size_t)M * K - 1, b = (size_t)N * K - 1;
        float x = evo_h2f(A[a * threadIdx.x / 31]), y = evo_h2f(B[b * threadIdx.x / 31]);
        bool mine = x == truncf(x) && y == truncf(y) && fabsf(x) <= 16.f && fabsf(y) <= 16.f;
        small_ints = __all_sync(0xffffffffu, mine);
    }
    __syncthreads();
    float acc[4][4] = {};
    const int kend = (small_ints && K > EVO_BK) ? (K - 1) / EVO_BK * EVO_BK : K;
    evo_mainloop(A, B, M, N, K, 0, kend, acc);
    evo_store(C, M, N, acc);
}
