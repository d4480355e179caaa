//@embed _base.cu
// A generic kernel wrong for M in 2..6 only (a decode-sized special case that skips the last
// k-tile); the old ragged instances had M of 1, 7, 65 and above.
extern "C" __global__ void __launch_bounds__(256) hgemm_small_m(const evo_half* A, const evo_half* B, evo_half* C,
                                                                int M, int N, int K) {
    const int kend = (M >= 2 && M <= 6 && K > EVO_BK) ? (K - 1) / EVO_BK * EVO_BK : (M >= 2 && M <= 6) ? K - 1 : K;
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, kend, acc);
    evo_store(C, M, N, acc);
}
