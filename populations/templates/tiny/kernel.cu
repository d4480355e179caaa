// tiny: a latency-first HGEMM for small outputs (M or N <= 128), sm_80 and later.
//   One CTA per TM x TN output tile; its WARPS warps split the K range between them, each warp
//   computes the whole tile with mma.sync.m16n8k16 (fp32 accumulation) from fragments loaded
//   straight from global memory (no shared-memory pipeline: nothing to fill or drain), then
//   the warps add their partial tiles through shared memory. SPLIT_K > 1 splits K across CTAs
//   too: fp32 partial tiles go to workspace[SPLIT_K][M][N] and a reduce launch sums them.
//   CLUSTER > 1 (sm_90) splits K across the CTAs of a thread-block cluster instead: each CTA's
//   partial tile stays in its shared memory and every CTA adds a share of the tile's elements over
//   all of them through distributed shared memory, in one launch with no workspace (the reduce
//   launch costs a short-K tile about 1.5 us, bench/RESULTS.md section 27 (n)).
// Knobs arrive as #defines (see template.toml); no includes, so NVRTC compiles it fast. The
// renderer prepends the _prelude files named in template.toml: half_t/u32/u64, mma16816, f2h,
// pack2 (mma_sync.cuh), the cluster's K range, barrier and peer loads (cluster_k.cuh) and
// evo_splitk_reduce (splitk_reduce.cuh).

#define MI (TM / 16)
#define NI (TN / 8)
#define FR (MI * NI * 4)   // accumulator floats per thread
#define KSPLIT (SPLIT_K * CLUSTER)  // K shares (grid z); at most one of the two is > 1

// Element e of a tile kept as [fragment float][lane] (e = f * 32 + lane): its sum goes to C, or to
// this CTA's workspace slice with SPLIT_K > 1.
__device__ __forceinline__ void tiny_store(half_t* __restrict__ C, float* __restrict__ Wz, int e, float sum, int m0,
                                           int n0, int M, int N, int ldc) {
  const int f = e >> 5, l = e & 31, c = f & 3, ij = f >> 2;
  const int row = m0 + (ij / NI) * 16 + (l >> 2) + (c >> 1) * 8;
  const int col = n0 + (ij % NI) * 8 + (l & 3) * 2 + (c & 1);
  if (row < M && col < N) {
#if SPLIT_K > 1
    (void)C, (void)ldc;
    Wz[(long long)row * N + col] = sum;
#else
    (void)Wz;
    C[(long long)row * ldc + col] = f2h(sum);
#endif
  }
}


// Elements (row, k) and (row, k+1) of a row-major matrix, zero outside rows < nrows, k < kend.
// vec: one 4-byte load (k even, kend even, 4-byte aligned rows).
__device__ __forceinline__ u32 ld_pair(const half_t* __restrict__ p, int row, int nrows, int k, int kend,
                                       int ld, bool vec) {
  if (row >= nrows) return 0u;
  const half_t* q = p + (long long)row * ld + k;
  if (vec) return k < kend ? *reinterpret_cast<const u32*>(q) : 0u;
  const u32 lo = k < kend ? q[0] : 0u;
  const u32 hi = k + 1 < kend ? q[1] : 0u;
  return lo | (hi << 16);
}
// Elements (k, col) and (k+1, col) of a row-major K x N matrix (the NN layout's B).
__device__ __forceinline__ u32 ld_colpair(const half_t* __restrict__ p, int k, int kend, int col, int ncols, int ld) {
  if (col >= ncols) return 0u;
  const u32 lo = k < kend ? p[(long long)k * ld + col] : 0u;
  const u32 hi = k + 1 < kend ? p[(long long)(k + 1) * ld + col] : 0u;
  return lo | (hi << 16);
}

extern "C" __global__ void DEC_CLUSTER_DIMS __launch_bounds__(THREADS)
evo_tiny(const half_t* __restrict__ A, const half_t* __restrict__ B, half_t* __restrict__ C,
         float* __restrict__ W, int M_, int N_, int K_, int lda_, int ldb_, int ldc_) {
  MMA_PROBLEM_SIZE;
  (void)ldc;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int m0 = blockIdx.y * TM, n0 = blockIdx.x * TN;

  const int steps = (K + 15) / 16;  // k16 steps
#if KSPLIT > 1
  const int per = (steps + KSPLIT - 1) / KSPLIT;
  const int s0 = blockIdx.z * per, s1 = min(s0 + per, steps);
#else
  const int s0 = 0, s1 = steps;
#endif
  const int kend = min(K, s1 * 16);
  const bool vecA = (K % 2 == 0) && (lda % 2 == 0) && ((reinterpret_cast<u64>(A) & 3) == 0);
#if defined(EVO_LAYOUT_TN)
  const bool vecB = (K % 2 == 0) && (ldb % 2 == 0) && ((reinterpret_cast<u64>(B) & 3) == 0);
#endif

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

  for (int s = s0 + warp * KU; s < s1; s += WARPS * KU) {
    u32 af[KU][MI][4], bf[KU][NI][2];
#pragma unroll
    for (int u = 0; u < KU; ++u) {
      const int k = (s + u) * 16 + 2 * q;  // >= kend once s + u >= s1: loads give zeros
#pragma unroll
      for (int i = 0; i < MI; ++i) {
        const int r = m0 + i * 16 + g;
        af[u][i][0] = ld_pair(A, r, M, k, kend, lda, vecA);
        af[u][i][1] = ld_pair(A, r + 8, M, k, kend, lda, vecA);
        af[u][i][2] = ld_pair(A, r, M, k + 8, kend, lda, vecA);
        af[u][i][3] = ld_pair(A, r + 8, M, k + 8, kend, lda, vecA);
      }
#pragma unroll
      for (int j = 0; j < NI; ++j) {
        const int n = n0 + j * 8 + g;
#if defined(EVO_LAYOUT_TN)
        bf[u][j][0] = ld_pair(B, n, N, k, kend, ldb, vecB);
        bf[u][j][1] = ld_pair(B, n, N, k + 8, kend, ldb, vecB);
#else
        bf[u][j][0] = ld_colpair(B, k, kend, n, N, ldb);
        bf[u][j][1] = ld_colpair(B, k + 8, kend, n, N, ldb);
#endif
      }
    }
#pragma unroll
    for (int u = 0; u < KU; ++u)
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) mma16816(acc[i][j], af[u][i], bf[u][j]);
  }

#if SPLIT_K > 1
  float* Wz = W + (long long)blockIdx.z * M * N;
#else
  float* Wz = W;
#endif
#if WARPS > 1 || CLUSTER > 1
  // The warps' partial tiles: [warp][fragment float][lane] in shared memory (conflict-free).
  extern __shared__ __align__(16) float red[];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) red[(warp * FR + (i * NI + j) * 4 + c) * 32 + lane] = acc[i][j][c];
  __syncthreads();
#endif
#if WARPS > 1
  // Add the warps' partial tiles: into C (or the workspace), or with a cluster into warp 0's slice,
  // this CTA's partial tile for its peers (element e is read and written by one thread).
#pragma unroll
  for (int it = 0; it < (FR * 32 + THREADS - 1) / THREADS; ++it) {  // compile-time trip count
    const int e = tid + it * THREADS;
    if ((FR * 32) % THREADS != 0 && e >= FR * 32) break;
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) sum += red[w * FR * 32 + e];
#if CLUSTER > 1
    red[e] = sum;
#else
    tiny_store(C, Wz, e, sum, m0, n0, M, N, ldc);
#endif
  }
#endif
#if CLUSTER > 1
  // Every CTA of the cluster finishes a share of the tile, adding all CTAs' partial tiles in rank
  // order (the same order wherever the tile is, so the sum is deterministic).
  dec_cluster_sync();
  const int rank = (int)dec_cluster_rank();
#pragma unroll
  for (int it = 0; it < (FR * 32 + THREADS * CLUSTER - 1) / (THREADS * CLUSTER); ++it) {
    const int e = rank * THREADS + tid + it * THREADS * CLUSTER;
    if (e < FR * 32) {
      float sum = 0.f;
#pragma unroll
      for (int r = 0; r < CLUSTER; ++r) sum += dec_ld_peer(red + e, r);
      tiny_store(C, Wz, e, sum, m0, n0, M, N, ldc);
    }
  }
  dec_cluster_sync();  // no CTA leaves while another still reads its shared memory
#elif WARPS == 1
  // One warp: store the fragment pairs directly.
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + i * 16 + g + h * 8, col = n0 + j * 8 + q * 2;
        if (row >= M || col >= N) continue;
#if SPLIT_K > 1
        float* p = Wz + (long long)row * N + col;
        p[0] = acc[i][j][2 * h];
        if (col + 1 < N) p[1] = acc[i][j][2 * h + 1];
#else
        half_t* p = C + (long long)row * ldc + col;
        p[0] = f2h(acc[i][j][2 * h]);
        if (col + 1 < N) p[1] = f2h(acc[i][j][2 * h + 1]);
#endif
      }
#endif
}
