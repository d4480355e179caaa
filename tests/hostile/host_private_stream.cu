//@embed _base.cu
// A "convenience launcher" an LLM adds out of habit: runs the GEMM on its own stream, so the
// harness's events on the default stream time nothing and a sync-free caller sees garbage.
#include <cuda_runtime.h>

extern "C" __global__ void __launch_bounds__(256) hgemm_f32acc(const evo_half* A, const evo_half* B, evo_half* C,
                                                              int M, int N, int K) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}

extern "C" int launch(const evo_half* A, const evo_half* B, evo_half* C, int M, int N, int K) {
    static cudaStream_t side = nullptr;
    if (!side) cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking);
    dim3 grid((N + EVO_BN - 1) / EVO_BN, (M + EVO_BM - 1) / EVO_BM);
    hgemm_f32acc<<<grid, EVO_THREADS, 0, side>>>(A, B, C, M, N, K);
    return 0;
}
