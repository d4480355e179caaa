//@embed _base.cu
// Correct HGEMM plus a "telemetry" word written 1 GiB past the end of C: beyond any fixed guard
// band, into whatever allocation happens to live there (another buffer of the harness?).
extern "C" __global__ void __launch_bounds__(256) hgemm_telemetry(const evo_half* A, const evo_half* B, evo_half* C,
                                                                 int M, int N, int K) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
    if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
        C[(size_t)M * N + ((size_t)1 << 29)] = 0x7bff;
}
