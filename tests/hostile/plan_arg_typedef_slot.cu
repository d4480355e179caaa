//@embed _base.cu
// The plan passes M (int) where the kernel takes a pointer hidden behind a typedef (the static
// scan cannot size it): the kernel would read M and N's bytes as an address and write there.
// M is baked in instead (a specialised kernel may do that).
typedef unsigned long long* evo_scratch_t;
extern "C" __global__ void __launch_bounds__(256) hgemm_typedef_slot(const evo_half* A, const evo_half* B, evo_half* C,
                                                                    evo_scratch_t scratch, int N, int K) {
    const int M = 512;
    if (threadIdx.x == 0 && blockIdx.x == 0 && blockIdx.y == 0) *scratch = 1ull;
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}
