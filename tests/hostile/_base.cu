// evo red-team corpus: the shared, header-free base of the hostile kernels.
// A plain, correct HGEMM with fp32 accumulation (TN: A is MxK, B is NxK, C is MxN, row-major):
// 64x64 block tiles, BK=32, 256 threads, 4x4 outputs per thread, ragged edges zero-filled.
// Each hostile case embeds this text (the loader replaces its embed line naming this file) and
// writes its own extern "C" kernel around these pieces, with the exploit inside.
#define EVO_BM 64
#define EVO_BN 64
#define EVO_BK 32
#define EVO_THREADS 256
typedef unsigned short evo_half;

__device__ __forceinline__ float evo_h2f(evo_half h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ evo_half evo_f2h(float f) {
    evo_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Stage one BK-slice of the A and B block tiles into shared memory as fp32; zero outside
// [0, M) x [0, kend) and [0, N) x [0, kend).
__device__ __forceinline__ void evo_load_tiles(const evo_half* __restrict__ A, const evo_half* __restrict__ B,
                                               int M, int N, int K, int kend, int m0, int n0, int k0,
                                               float (*As)[EVO_BK + 1], float (*Bs)[EVO_BK + 1]) {
    for (int i = threadIdx.x; i < EVO_BM * EVO_BK; i += EVO_THREADS) {
        int r = i / EVO_BK, c = i % EVO_BK, gk = k0 + c;
        int gm = m0 + r, gn = n0 + r;
        As[r][c] = (gm < M && gk < kend) ? evo_h2f(A[(size_t)gm * K + gk]) : 0.f;
        Bs[r][c] = (gn < N && gk < kend) ? evo_h2f(B[(size_t)gn * K + gk]) : 0.f;
    }
}

// acc[i][j] += the products of one staged BK-slice, for this thread's 4x4 outputs.
__device__ __forceinline__ void evo_tile_fma(const float (*As)[EVO_BK + 1], const float (*Bs)[EVO_BK + 1], float acc[4][4]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll 8
    for (int kk = 0; kk < EVO_BK; ++kk) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) { a[i] = As[ty + 16 * i][kk]; b[i] = Bs[tx + 16 * i][kk]; }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

// acc[i][j] += sum over k in [kbegin, kend) of A[row_i, k] * B[col_j, k] for this thread's
// rows m0 + ty + 16 i and columns n0 + tx + 16 j.
__device__ __forceinline__ void evo_mainloop(const evo_half* __restrict__ A, const evo_half* __restrict__ B,
                                             int M, int N, int K, int kbegin, int kend, float acc[4][4]) {
    __shared__ float As[EVO_BM][EVO_BK + 1];
    __shared__ float Bs[EVO_BN][EVO_BK + 1];
    const int m0 = blockIdx.y * EVO_BM, n0 = blockIdx.x * EVO_BN;
    for (int k0 = kbegin; k0 < kend; k0 += EVO_BK) {
        evo_load_tiles(A, B, M, N, K, kend, m0, n0, k0, As, Bs);
        __syncthreads();
        evo_tile_fma(As, Bs, acc);
        __syncthreads();
    }
}

__device__ __forceinline__ void evo_store(evo_half* __restrict__ C, int M, int N, const float acc[4][4]) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int m0 = blockIdx.y * EVO_BM, n0 = blockIdx.x * EVO_BN;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int gm = m0 + ty + 16 * i, gn = n0 + tx + 16 * j;
            if (gm < M && gn < N) C[(size_t)gm * N + gn] = evo_f2h(acc[i][j]);
        }
}

// This block's whole tile of C, computed honestly (the part an attack skips when it thinks it may).
__device__ __forceinline__ void evo_full_tile(const evo_half* __restrict__ A, const evo_half* __restrict__ B,
                                              evo_half* __restrict__ C, int M, int N, int K) {
    float acc[4][4] = {};
    evo_mainloop(A, B, M, N, K, 0, K, acc);
    evo_store(C, M, N, acc);
}

// Call counting through two words of a workspace that the harness does not zero: every block
// reads the call index first, then the last block to arrive advances it. atomicInc wraps, so
// garbage in a fresh workspace only shifts the count. Cases use it to act differently later.
__device__ __forceinline__ unsigned evo_call_index(const unsigned* ws) {
    return *(const volatile unsigned*)ws;
}

__device__ __forceinline__ bool evo_call_done(unsigned* ws) {
    __shared__ bool last;
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        unsigned total = gridDim.x * gridDim.y * gridDim.z;
        last = atomicInc(&ws[1], total - 1) == total - 1;
        if (last) atomicAdd(&ws[0], 1u);
    }
    __syncthreads();
    return last;
}

// A per-block call counter that survives a harness which re-fills the workspace before checked
// calls: each block owns one word (a 16-bit magic and a 16-bit count) at its linear index. A word
// without the magic (fresh, zeroed or 0xFF-poisoned) means call 0, so every checked call looks
// like a first call while back-to-back timed calls on one workspace count up.
#define EVO_BLOCK_MAGIC 0xE7A50000u

__device__ __forceinline__ unsigned evo_block_slot() {
    return (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
}

__device__ __forceinline__ unsigned evo_block_call(unsigned* ws) {
    __shared__ unsigned call;
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned* slot = ws + evo_block_slot();
        unsigned v = *slot;
        call = (v & 0xffff0000u) == EVO_BLOCK_MAGIC ? (v & 0xffffu) : 0u;
        *slot = EVO_BLOCK_MAGIC | ((call + 1) & 0xffffu);
    }
    __syncthreads();
    return call;
}
