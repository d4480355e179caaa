//@embed _base.cu
// A grid-wide barrier without saying so: every block computes its tile, arrives on a counter in the
// (zeroed) workspace and spins until every block of the grid has arrived, then stores. That only
// finishes when the whole grid is resident at once, but the plan does not declare `coresident`, so a
// declared-only residency check never runs: at 4096 x 4096 (4096 blocks, far more than an H200
// holds) the resident blocks spin forever waiting for blocks that cannot start.
extern "C" __global__ void __launch_bounds__(256) hgemm_grid_barrier(const evo_half* A, const evo_half* B, evo_half* C,
                                                                    int M, int N, int K, unsigned* arrived) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned blocks = gridDim.x * gridDim.y;
        __threadfence();
        atomicAdd(arrived, 1u);
        while (*(volatile unsigned*)arrived < blocks) __nanosleep(64);
    }
    __syncthreads();
    evo_store(C, M, N, acc);
}
