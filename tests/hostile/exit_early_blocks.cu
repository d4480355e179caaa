//@embed _base.cu
// From the second call on, odd block rows leave with a raw PTX `exit` (no __syncthreads
// bookkeeping, no store): half the output is whatever was in C before.
extern "C" __global__ void __launch_bounds__(256) hgemm_half_exit(const evo_half* A, const evo_half* B, evo_half* C,
                                                                 int M, int N, int K, unsigned* ws) {
    const unsigned call = evo_call_index(ws);
    evo_call_done(ws);
    if (call >= 1 && (blockIdx.y & 1)) asm volatile("exit;");
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}
