// gemv: weight-streaming CUDA-core GEMV for decode (a few tokens), TN layout, sm_80 and later.
//   C[m][n] = sum_k A[m][k] * B[n][k]. One CTA owns ROWS weight rows and TOK tokens; its
//   THREADS threads split K into 16-byte chunks (8 halves), thread t taking chunks t, t +
//   THREADS, ... and loading UNROLL x ROWS of them before any arithmetic (bytes in flight are
//   what an HBM-bound kernel needs; PIPE = 1 issues the next iteration's loads before this one's
//   FMAs). Weights stream once through ld.global.nc.L1::no_allocate,
//   tokens are read through L1; fp32 FMA. Partial sums: warp shuffles (one warp: stored from
//   registers), then the CTA's warps in shared memory, then (CLUSTER > 1, sm_90) the CTAs of a cluster that split K between them,
//   through distributed shared memory: one launch, no workspace.
//   Grid: x = cdiv(N, ROWS * TILES) * cdiv(M, TOK) (token groups of one row tile adjacent, so a row
//   tile read twice is read from L2), z = CLUSTER; TILES > 1 runs that many row tiles per CTA in
//   turn, the next tile's loads issued ahead of this one's epilogue (gemv_tiles). Any M, N, K >= 1:
//   rows and tokens past the edge are clamped loads whose sums are never stored. Rows that do not
//   start on 16 bytes (K % 8 != 0, misaligned pointers): RAGGED = 1 compiles only the realigning
//   path (decode.cuh: aligned 16-byte loads shifted into place in registers, the next block from
//   the neighbouring lane: the aligned path's bytes per FMA), RAGGED = 0 the 16-byte path with a
//   2-byte fallback for such rows (one kernel holding both would need the realigning path's
//   registers on the aligned one too).
// Knobs arrive as #defines (template.toml); prelude: _prelude/decode.cuh.

#define THREADS (WARPS * 32)
#define RED (ROWS * TOK)   // outputs of one CTA

// One iteration's operands: UNROLL chunks of ROWS weight rows and TOK token rows, all loaded before
// any FMA (one memory round trip per iteration, not one per chunk). Chunks at or past c1 are zeros.
struct GemvFrag {
  uint4 w[UNROLL][ROWS], x[UNROLL][TOK];
};
template <bool VEC>
__device__ __forceinline__ void gemv_load(GemvFrag& f, int c, int c1, const unsigned short* const (&brow)[ROWS],
                                          const unsigned short* const (&arow)[TOK], int K) {
  if (!VEC && RAGGED) {
    // the realigning path, the whole warp on every chunk: every block load of the iteration first
    // (UNROLL x (ROWS + TOK) in flight), then the shuffles and shifts (decode.cuh dec_raw / dec_join)
    DecRaw rw[UNROLL][ROWS], rx[UNROLL][TOK];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) rw[u][r] = dec_raw<true>(brow[r], c + u * THREADS, c1, K);
#pragma unroll
      for (int t = 0; t < TOK; ++t) rx[u][t] = dec_raw<false>(arow[t], c + u * THREADS, c1, K);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) f.w[u][r] = dec_join(rw[u][r], c + u * THREADS, c1, K);
#pragma unroll
      for (int t = 0; t < TOK; ++t) f.x[u][t] = dec_join(rx[u][t], c + u * THREADS, c1, K);
    }
    return;
  }
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int cc = c + u * THREADS;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      if (cc >= c1) f.w[u][r] = make_uint4(0u, 0u, 0u, 0u);
      else if (VEC) f.w[u][r] = dec_ld_stream(brow[r] + cc * 8);
      else f.w[u][r] = dec_ld_tail(brow[r], cc * 8, K);
    }
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
      if (cc >= c1) f.x[u][t] = make_uint4(0u, 0u, 0u, 0u);
      else if (VEC) f.x[u][t] = dec_ld_keep(arow[t] + cc * 8);
      else f.x[u][t] = dec_ld_tail(arow[t], cc * 8, K);
    }
  }
}
// acc[r][t] += dot(w[u][r], x[u][t]) over the UNROLL chunks, in fp32 (zero chunks add nothing).
__device__ __forceinline__ void gemv_fma(float (&acc)[ROWS][TOK], const GemvFrag& f) {
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    float a[TOK][8];
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
      const unsigned int h[4] = {f.x[u][t].x, f.x[u][t].y, f.x[u][t].z, f.x[u][t].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 v = dec_h2f2(h[j]);
        a[t][2 * j] = v.x;
        a[t][2 * j + 1] = v.y;
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const unsigned int h[4] = {f.w[u][r].x, f.w[u][r].y, f.w[u][r].z, f.w[u][r].w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 v = dec_h2f2(h[j]);
#pragma unroll
        for (int t = 0; t < TOK; ++t) {
          acc[r][t] = fmaf(a[t][2 * j], v.x, acc[r][t]);
          acc[r][t] = fmaf(a[t][2 * j + 1], v.y, acc[r][t]);
        }
      }
    }
  }
}

// acc = 0 before a tile's K loop.
__device__ __forceinline__ void gemv_zero(float (&acc)[ROWS][TOK]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < TOK; ++t) acc[r][t] = 0.f;
}
// Every acc summed over the warp (butterfly: each lane ends with the warp's sum).
__device__ __forceinline__ void gemv_butterfly(float (&acc)[ROWS][TOK]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
      float v = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      acc[r][t] = v;
    }
}
// One warp, no cluster: the butterfly leaves every sum in every lane, so the lanes store the CTA's
// outputs straight from registers (output i by lane i % 32; indices are compile-time, acc stays in
// registers): no shared memory, no barrier, no second pass. The plain peer's one-warp epilogue
// (lane 0 stores all) is the same round trip.
__device__ __forceinline__ void gemv_store_warp(float (&acc)[ROWS][TOK], int n0, int m0, unsigned short* __restrict__ C,
                                                int M, int N, int lane) {
  gemv_butterfly(acc);
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
      const int n = n0 + r, m = m0 + t;
      if (lane == ((r * TOK + t) & 31) && n < N && m < M) C[(long long)m * N + n] = dec_f2h(acc[r][t]);
    }
}
// The butterfly, then lane 0 puts the warp's sums in its row of the CTA's reduction buffer rb (the
// caller synchronises after).
__device__ __forceinline__ void gemv_warp_sums(float (&acc)[ROWS][TOK], float (&rb)[WARPS][RED], int warp, int lane) {
  gemv_butterfly(acc);
  if (lane == 0) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int t = 0; t < TOK; ++t) rb[warp][r * TOK + t] = acc[r][t];
  }
}

// The K loop of one thread over chunks [c0 + tid, c1) with stride THREADS * UNROLL. VEC is a template
// argument so the 16-byte path and the 2-byte fallback are separate loops: the fallback's registers
// never count at the fast loop's program points (ptxas allocates for the worst point).
template <bool VEC>
__device__ __forceinline__ void gemv_mainloop(float (&acc)[ROWS][TOK], int c, int c1,
                                              const unsigned short* const (&brow)[ROWS],
                                              const unsigned short* const (&arow)[TOK], int K) {
  // the realigning path shuffles blocks between lanes: its loop runs while the warp's first lane has
  // a chunk (lanes past c1 load zeros), so no lane leaves it early
  const int lag = VEC || !RAGGED ? 0 : (int)(threadIdx.x & 31);
#if PIPE
  // Ping-pong: the loads of the next iteration are in flight while this one's FMAs run.
  const int stride = THREADS * UNROLL;
  GemvFrag f0, f1;
  gemv_load<VEC>(f0, c, c1, brow, arow, K);
  for (; c - lag < c1; c += 2 * stride) {
    gemv_load<VEC>(f1, c + stride, c1, brow, arow, K);
    gemv_fma(acc, f0);
    gemv_load<VEC>(f0, c + 2 * stride, c1, brow, arow, K);
    gemv_fma(acc, f1);
  }
#else
  for (; c - lag < c1; c += THREADS * UNROLL) {
    GemvFrag f;
    gemv_load<VEC>(f, c, c1, brow, arow, K);
    gemv_fma(acc, f);
  }
#endif
}

#if ISSUE
// ISSUE = 1, 16-byte path only: the iterations whose UNROLL chunks are all inside [c, c1) run
// without a per-chunk bound test, from row pointers that advance by a constant (loads at a base
// register plus an immediate offset, no row * K + chunk arithmetic), in a loop kept rolled, loads
// written before the FMAs; the last partial iteration takes the bounded gemv_load. This is the
// plain peer's loop shape: in the SASS (sm_90a, 1 row, 8 warps, UNROLL 2) 59 instructions per
// iteration against ISSUE = 0's 92, all four loads ahead of the first FFMA (ISSUE = 0 issued the
// second token load only after an FFMA that waits for the first weight load). At ROWS >= 2 ptxas
// still places two weight loads after the first FFMA (it reuses an accumulator register to stay
// at ~40 registers).
__device__ __forceinline__ void gemv_mainloop_issue(float (&acc)[ROWS][TOK], int c, int c1,
                                                    const unsigned short* const (&brow)[ROWS],
                                                    const unsigned short* const (&arow)[TOK], int K) {
  constexpr int STRIDE = THREADS * UNROLL;
  const unsigned short* bp[ROWS];
  const unsigned short* ap[TOK];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) bp[r] = brow[r] + c * 8;
#pragma unroll
  for (int t = 0; t < TOK; ++t) ap[t] = arow[t] + c * 8;
#pragma unroll 1
  for (; c + (UNROLL - 1) * THREADS < c1; c += STRIDE) {
    GemvFrag f;
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
#pragma unroll
      for (int r = 0; r < ROWS; ++r) f.w[u][r] = dec_ld_stream_v(bp[r] + u * THREADS * 8);
#pragma unroll
      for (int t = 0; t < TOK; ++t) f.x[u][t] = dec_ld_keep_v(ap[t] + u * THREADS * 8);
    }
    gemv_fma(acc, f);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) bp[r] += STRIDE * 8;
#pragma unroll
    for (int t = 0; t < TOK; ++t) ap[t] += STRIDE * 8;
  }
  if (c < c1) {
    GemvFrag f;
    gemv_load<true>(f, c, c1, brow, arow, K);
    gemv_fma(acc, f);
  }
}
#endif

#if TILES > 1
// TILES > 1 (no cluster, PIPE 0, ISSUE 0): the CTA owns TILES consecutive row tiles of ROWS rows and
// runs them in turn, issuing the next tile's first loads right after this tile's last FMAs, before
// its shuffles, shared-memory reduction and stores: the epilogue (and the next CTA's launch) no
// longer stands between two tiles' memory round trips. When THREADS * UNROLL chunks cover K (one
// iteration per tile: the small-K rows), every tile's loads are in flight during the previous
// tile's epilogue. Partial sums go through a double-buffered red (one barrier per tile: a buffer
// is written again only after the next tile's barrier, which every reader of it has passed).
template <bool VEC>
__device__ __forceinline__ void gemv_tiles(int nb, int m0, int c0, int c1, const unsigned short* __restrict__ A,
                                           const unsigned short* __restrict__ B, unsigned short* __restrict__ C,
                                           int M, int N, int K, float (&red)[2][WARPS][RED]) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const unsigned short* arow[TOK];
#pragma unroll
  for (int t = 0; t < TOK; ++t) arow[t] = A + (long long)min(m0 + t, M - 1) * K;
  const unsigned short* brow[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) brow[r] = B + (long long)min(nb + r, N - 1) * K;
  GemvFrag f;
  gemv_load<VEC>(f, c0 + tid, c1, brow, arow, K);
#pragma unroll 1
  for (int ti = 0; ti < TILES; ++ti) {
    const int n0 = nb + ti * ROWS;
    if (n0 >= N) break;  // uniform over the CTA: every thread leaves together, no barrier skipped
    float acc[ROWS][TOK];
    gemv_zero(acc);
    // f holds this tile's first iteration (zeros where this thread has no chunk)
#pragma unroll 1
    for (int c = c0 + tid;;) {
      gemv_fma(acc, f);
      c += THREADS * UNROLL;
      if (c - (VEC || !RAGGED ? 0 : lane) >= c1) break;  // warp-uniform on the realigning path (shuffles)
      gemv_load<VEC>(f, c, c1, brow, arow, K);
    }
    if (ti + 1 < TILES && n0 + ROWS < N) {  // the next tile's first loads, ahead of this epilogue
#pragma unroll
      for (int r = 0; r < ROWS; ++r) brow[r] = B + (long long)min(n0 + ROWS + r, N - 1) * K;
      gemv_load<VEC>(f, c0 + tid, c1, brow, arow, K);
    }
#if WARPS == 1
    (void)red, (void)warp;
    gemv_store_warp(acc, n0, m0, C, M, N, lane);
#else
    float (&rb)[WARPS][RED] = red[ti & 1];
    gemv_warp_sums(acc, rb, warp, lane);
    __syncthreads();
    for (int i = tid; i < RED; i += THREADS) {
      float s = 0.f;
#pragma unroll
      for (int q = 0; q < WARPS; ++q) s += rb[q][i];
      const int n = n0 + i / TOK, m = m0 + i % TOK;
      if (n < N && m < M) C[(long long)m * N + n] = dec_f2h(s);
    }
#endif
  }
}
#endif

extern "C" __global__ void DEC_CLUSTER_DIMS DEC_BOUNDS(THREADS)
evo_gemv(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B, unsigned short* __restrict__ C,
         int M_, int N_, int K_) {
  DEC_PROBLEM_SIZE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int groups = (M + TOK - 1) / TOK;
  const int n0 = (blockIdx.x / groups) * (ROWS * TILES), m0 = (blockIdx.x % groups) * TOK;

  int c0, c1;  // this CTA's 16-byte K chunks
  dec_k_range((K + 7) >> 3, c0, c1);
  const bool vec = dec_vec16(A, B, K);  // false with RAGGED 1: the realigning path only (decode.cuh)
#if TILES > 1
  __shared__ float red2[2][WARPS][RED];
  if (vec) gemv_tiles<true>(n0, m0, c0, c1, A, B, C, M, N, K, red2);
  else gemv_tiles<false>(n0, m0, c0, c1, A, B, C, M, N, K, red2);
#else

  const unsigned short* brow[ROWS];
  const unsigned short* arow[TOK];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) brow[r] = B + (long long)min(n0 + r, N - 1) * K;
#pragma unroll
  for (int t = 0; t < TOK; ++t) arow[t] = A + (long long)min(m0 + t, M - 1) * K;

  float acc[ROWS][TOK];
  gemv_zero(acc);

#if ISSUE
  if (vec) gemv_mainloop_issue(acc, c0 + tid, c1, brow, arow, K);
#else
  if (vec) gemv_mainloop<true>(acc, c0 + tid, c1, brow, arow, K);
#endif
  else gemv_mainloop<false>(acc, c0 + tid, c1, brow, arow, K);

#if WARPS == 1 && CLUSTER == 1
  (void)tid, (void)warp;
  gemv_store_warp(acc, n0, m0, C, M, N, lane);
#else
  __shared__ float red[WARPS][RED];
  gemv_warp_sums(acc, red, warp, lane);
  __syncthreads();
#if CLUSTER > 1
  __shared__ float part[RED];
#endif
  for (int i = tid; i < RED; i += THREADS) {
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < WARPS; ++q) s += red[q][i];
#if CLUSTER > 1
    part[i] = s;
#else
    const int n = n0 + i / TOK, m = m0 + i % TOK;
    if (n < N && m < M) C[(long long)m * N + n] = dec_f2h(s);
#endif
  }
#if CLUSTER > 1
  // Every CTA of the cluster finishes RED / CLUSTER outputs, adding the partial sums of all.
  dec_cluster_sync();
  const unsigned int rank = dec_cluster_rank();
  for (int i = rank + tid * CLUSTER; i < RED; i += THREADS * CLUSTER) {
    float s = 0.f;
#pragma unroll
    for (int q = 0; q < CLUSTER; ++q) s += dec_ld_peer(&part[i], q);
    const int n = n0 + i / TOK, m = m0 + i % TOK;
    if (n < N && m < M) C[(long long)m * N + n] = dec_f2h(s);
  }
  dec_cluster_sync();  // no CTA leaves while another still reads its shared memory
#endif
#endif  // WARPS == 1 && CLUSTER == 1
#endif  // TILES > 1
}
