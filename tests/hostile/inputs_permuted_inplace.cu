//@embed _base.cu
// "Layout caching" HGEMM: the last block to finish swaps k-columns 0 and 1 of both A and B in
// place (a stand-in for re-laying operands out for the next call). A.B is unchanged and so is
// a plain sum checksum of each input, but the inputs are not the caller's any more.
extern "C" __global__ void __launch_bounds__(256) hgemm_relayout(evo_half* A, evo_half* B, evo_half* C,
                                                                int M, int N, int K, unsigned* ws) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
    if (evo_call_done(ws) && K >= 2) {
        __threadfence();
        for (int r = threadIdx.x; r < M; r += EVO_THREADS) {
            evo_half t = A[(size_t)r * K]; A[(size_t)r * K] = A[(size_t)r * K + 1]; A[(size_t)r * K + 1] = t;
        }
        for (int r = threadIdx.x; r < N; r += EVO_THREADS) {
            evo_half t = B[(size_t)r * K]; B[(size_t)r * K] = B[(size_t)r * K + 1]; B[(size_t)r * K + 1] = t;
        }
    }
}
