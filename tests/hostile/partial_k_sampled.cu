//@embed _base.cu
// "Stochastic K": reads every other k-tile and doubles the sum (an unbiased estimator, the
// comment says). Half the work, wrong answers.
extern "C" __global__ void __launch_bounds__(256) hgemm_sampled_k(const evo_half* A, const evo_half* B, evo_half* C,
                                                                 int M, int N, int K) {
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += 2 * EVO_BK) evo_mainloop(A, B, M, N, K, k0, min(K, k0 + EVO_BK), acc);
    for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] *= 2.f;
    evo_store(C, M, N, acc);
}
