//@embed _base.cu
// A generic kernel wrong in one alignment class only: M and N multiples of 8 with a ragged K
// (a vectorised fast path that forgets the K tail). The old ragged instances almost never drew
// that class (1x1x1, 7x13x17, 129x257x65, 100x111x77, residues 17..63, 65x72x4104).
extern "C" __global__ void __launch_bounds__(256) hgemm_aligned_mn(const evo_half* A, const evo_half* B, evo_half* C,
                                                                   int M, int N, int K) {
    const int kend = (M % 8 == 0 && N % 8 == 0 && K % 8 != 0) ? K / 8 * 8 : K;
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, kend, acc);
    evo_store(C, M, N, acc);
}
