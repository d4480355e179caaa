//@embed _base.cu
// The honest control: the base HGEMM, nothing else.
extern "C" __global__ void __launch_bounds__(256) hgemm_f32acc(const evo_half* A, const evo_half* B, evo_half* C,
                                                              int M, int N, int K) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}
