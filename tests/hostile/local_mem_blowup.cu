//@embed _base.cu
// "Register-blocked" HGEMM that keeps a per-thread history of every A value it consumed in a
// 32 KiB local array with a data-dependent index: correct, and a 32 KiB stack frame per thread.
extern "C" __global__ void __launch_bounds__(256) hgemm_history(const evo_half* A, const evo_half* B, evo_half* C,
                                                               int M, int N, int K) {
    float history[8192];
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int gm = blockIdx.y * EVO_BM + ty;
    for (int k = 0; k < K; ++k) {
        evo_half h = gm < M ? A[(size_t)gm * K + k] : 0;
        history[(k * 2654435761u + h) & 8191] = evo_h2f(h);
    }
    float bias = 0.f;
    for (int k = 0; k < K; ++k) {
        int at = (k * 40503u + tx) & 8191;
        bias += history[at] - history[at];   // exactly zero for finite inputs; keeps the array alive
    }
    acc[0][0] += bias;
    evo_store(C, M, N, acc);
}
