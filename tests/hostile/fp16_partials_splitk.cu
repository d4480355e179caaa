//@embed _base.cu
// Split-K in two launches: four K-slices accumulate in fp32 but park their partial tiles in the
// workspace as fp16 (half the traffic), and a second kernel adds them in fp32. A partial sum
// above 65504 becomes inf even when the final result is in range.
#define SPLITS 4

extern "C" __global__ void __launch_bounds__(256) hgemm_splitk_partial(const evo_half* A, const evo_half* B,
                                                                      evo_half* ws, int M, int N, int K) {
    const int chunk = ((K + SPLITS - 1) / SPLITS + EVO_BK - 1) / EVO_BK * EVO_BK;
    const int kb = blockIdx.z * chunk, ke = min(K, kb + chunk);
    float acc[4][4] = {};
    if (kb < ke) evo_mainloop(A, B, M, N, K, kb, ke, acc);
    evo_store(ws + (size_t)blockIdx.z * M * N, M, N, acc);
}

extern "C" __global__ void __launch_bounds__(256) hgemm_splitk_reduce(const evo_half* ws, evo_half* C, int M, int N) {
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, total = (size_t)M * N;
    if (i >= total) return;
    float s = 0.f;
#pragma unroll
    for (int z = 0; z < SPLITS; ++z) s += evo_h2f(ws[z * total + i]);
    C[i] = evo_f2h(s);
}
