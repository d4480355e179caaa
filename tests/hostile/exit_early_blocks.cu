//@embed _base.cu
// From the second call on a workspace, odd block rows leave with a raw PTX `exit` before their
// store: half the output is whatever C held before.
extern "C" __global__ void __launch_bounds__(256) hgemm_half_exit(const evo_half* A, const evo_half* B, evo_half* C,
                                                                 int M, int N, int K, unsigned* ws) {
    if (evo_block_call(ws) >= 1 && (blockIdx.y & 1)) asm volatile("exit;");
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}
