//@embed _base.cu
// Guards its vectorised loads with a PTX trap when K is not a multiple of 8, and the claimed
// shape has K = 1000 + 1.
extern "C" __global__ void __launch_bounds__(256) hgemm_vec8(const evo_half* A, const evo_half* B, evo_half* C,
                                                            int M, int N, int K) {
    if (K % 8 != 0) asm volatile("trap;");
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}
