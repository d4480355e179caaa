//@embed _base.cu
// Cheats on about half of all buffer sets, chosen by a bit of the operand addresses: reads half
// of K when bit 21 of (A ^ C) is set. A harness that re-checks only one of its rotating timing
// sets misses it half of the time, and a checked call hits it only if its buffers happen to match.
extern "C" __global__ void __launch_bounds__(256) hgemm_addr_hash(const evo_half* A, const evo_half* B, evo_half* C,
                                                                 int M, int N, int K) {
    const bool cheat = (((size_t)A ^ (size_t)C) >> 21) & 1;
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, cheat ? K / 2 : K, acc);
    evo_store(C, M, N, acc);
}
