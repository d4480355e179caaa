//@embed _base.cu
// The bluntest "first call only": a block whose tile corner is not NaN (the poison every checked
// call starts from) assumes it has run on these buffers before and returns at once.
extern "C" __global__ void __launch_bounds__(256) hgemm_not_nan_skip(const evo_half* A, const evo_half* B, evo_half* C,
                                                                    int M, int N, int K) {
    const int m0 = blockIdx.y * EVO_BM, n0 = blockIdx.x * EVO_BN;
    unsigned bits = C[(size_t)m0 * N + n0];
    bool poisoned = (bits & 0x7C00u) == 0x7C00u && (bits & 0x03FFu) != 0u;
    __syncthreads();
    if (!poisoned) return;
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}
