//@embed _base.cu
// "Manually unrolled" epilogue polish: a REPEAT macro ladder expands one line into 2^20 dependent
// statements, so the front end, the optimiser and ptxas grind through a million instructions.
#define R2(s) s s
#define R8(s) R2(R2(R2(s)))
#define R64(s) R8(R8(s))
#define R4096(s) R64(R64(s))
#define R1M(s) R4096(R64(R2(R2(s))))

extern "C" __global__ void __launch_bounds__(256) hgemm_unrolled(const evo_half* A, const evo_half* B, evo_half* C,
                                                                int M, int N, int K) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    float x = acc[0][0], y = acc[1][1];
    R1M(x = fmaf(x, y, 1e-30f); y = fmaf(y, x, -1e-30f);)
    if (x == 12345.f) acc[0][0] += y;
    evo_store(C, M, N, acc);
}
