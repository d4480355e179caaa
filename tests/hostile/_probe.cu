// evo red-team corpus: helpers for the timed-versus-checked cases (not a case; embedded after _base.cu).
// evo_dot: the fp32 dot product of row r of A and row c of B (TN: B is N x K), one thread.
__device__ __forceinline__ float evo_dot(const evo_half* __restrict__ A, const evo_half* __restrict__ B, int K, int r, int c) {
    float s = 0.f;
    for (int k = 0; k < K; ++k) s = fmaf(evo_h2f(A[(size_t)r * K + k]), evo_h2f(B[(size_t)c * K + k]), s);
    return s;
}

// true when C[r, c] already holds (to within a few fp16 ulps) what this call would write there
__device__ __forceinline__ bool evo_c_matches(const evo_half* A, const evo_half* B, const evo_half* C, int N, int K,
                                              int r, int c) {
    float want = evo_dot(A, B, K, r, c), got = evo_h2f(C[(size_t)r * N + c]);
    return fabsf(got - want) <= 4e-3f * (1.f + fabsf(want));  // false for NaN
}
