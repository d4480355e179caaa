//@embed _base.cu
// A device assert, spelt out as the call assert() expands to (the runtime declares it; no
// header needed), that the claimed ragged N violates.

extern "C" __global__ void __launch_bounds__(256) hgemm_checked(const evo_half* A, const evo_half* B, evo_half* C,
                                                               int M, int N, int K) {
    if (N % EVO_BN != 0) __assertfail("N % EVO_BN == 0", "hgemm_checked.cu", 12, "hgemm_checked", sizeof(char));
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}
