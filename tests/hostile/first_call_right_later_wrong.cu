//@embed _base.cu
// Right on the first call, then it drops the last k-tile: a "warm" path that was never tested.
extern "C" __global__ void __launch_bounds__(256) hgemm_warm_path(const evo_half* A, const evo_half* B, evo_half* C,
                                                                 int M, int N, int K, unsigned* ws) {
    const unsigned call = evo_call_index(ws);
    evo_call_done(ws);
    const int kend = (call == 0 || K <= EVO_BK) ? K : (K - 1) / EVO_BK * EVO_BK;
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, kend, acc);
    evo_store(C, M, N, acc);
}
