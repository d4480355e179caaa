// swab: swap-AB tensor-core GEMM for decode and skinny shapes (M <= 64 tokens), TN, sm_80 and later.
//   Computes C^T = B * A^T with mma.sync.m16n8k16: 16 weight rows fill the mma's M side (RT of
//   them per CTA), the tokens its 8-wide N side (NT n8 tiles per CTA), so no tile row is padding
//   when M is small. Fragments come straight from global memory, no shared-memory staging: in a
//   32-wide K step, lane (g, q) loads 16 contiguous bytes (k = 8q .. 8q + 7) of weight rows g and
//   g + 8 and of token g; the mma's logical k pairs (2q, 2q + 1) and (2q + 8, 2q + 9) then map to
//   physical (8q, 8q + 1) and (8q + 2, 8q + 3) in the first mma and the next four in the second,
//   the same permutation for both operands, so every dot product is unchanged. Each warp takes
//   U consecutive steps (U * 64 contiguous bytes per row) and loads all of them before its mmas;
//   PIPE = 1 issues the next iteration's loads before this one's mmas (ping-pong registers).
//   WMAP = 0: K is split across the CTA's WARPS warps (shared-memory reduction); WMAP = 1: each warp
//   owns its own RT weight tiles over the CTA's whole K range, so the warps of a CTA load the same
//   token fragments at the same k and all but the first hit L1 (at M = 16 the tokens are as many
//   bytes per k-step as one 16-row weight tile: with WMAP = 0 every warp fetches them from L2).
//   On sm_90 K is also split across the CLUSTER CTAs of a cluster (distributed shared memory; one
//   launch, no workspace).
//   Grid: x = cdiv(N, ROWS_CTA) * cdiv(M, 8 * NT) (ROWS_CTA = 16 * RT, times WARPS with WMAP = 1),
//   the token groups of one weight tile adjacent (a weight tile read by two groups is served from
//   L2 the second time); z = CLUSTER.
//   Any M, N, K >= 1: edge rows/tokens are clamped loads whose results are never stored. Rows that
//   do not start on 16 bytes (K % 8 != 0, misaligned operands): RAGGED = 1 compiles only the
//   realigning path (aligned 16-byte blocks shifted into place, swab_row_ragged), RAGGED = 0 the
//   16-byte path with a 2-byte fallback for such rows.
// Knobs arrive as #defines (template.toml); preludes: mma_sync.cuh, decode.cuh.

#define THREADS (WARPS * 32)
#define FR (RT * NT * 4)   // accumulator floats per thread
#ifndef WMAP
#define WMAP 0
#endif
#if WMAP
#define ROWS_CTA (16 * RT * WARPS)  // each warp its own 16 * RT rows, the CTA's whole K range
#define WSTART 0
#define WSTRIDE U
#else
#define ROWS_CTA (16 * RT)          // the warps split the CTA's K steps, U at a time
#define WSTART (warp * U)
#define WSTRIDE (WARPS * U)
#endif

// One iteration's fragments: U consecutive k32 steps from step s of RT weight tile pairs (rows g,
// g + 8) and NT token tiles, all loaded before any mma. Steps at or past s1 are zeros. KMAP picks
// which physical 8-element chunk of the U * 32 elements lane q holds for mma u: any bijection is
// exact as long as weights and tokens use the same one.
struct SwabFrag {
  uint4 lo[U][RT], hi[U][RT], x[U][NT];
};
#if RAGGED
// RAGGED = 1: the U logical chunks this lane holds of the row at p, read as aligned 16-byte blocks
// shifted into place (decode.cuh). A chunk's next block is held by the lane (g, q + 1) at the same
// step (KMAP 0, q < 3), by the lane (g, 0) at the next step (KMAP 0, q = 3), by this lane at the
// next u (KMAP 1), or by the lane (g, q + 1) at u = 0 (KMAP 1, u = U - 1); a lane whose neighbour
// lies in the next iteration loads it itself. The whole warp calls it (shuffles): swab's K loop is
// warp-uniform.
template <bool STREAM>
__device__ __forceinline__ void swab_row_ragged(uint4 (&out)[U], const unsigned short* p, int s, int jend, int q,
                                                int K) {
  const uint4* base;
  int sh;
  dec_grid(p, base, sh);
  const int lane = (int)(threadIdx.x & 31);
  uint4 raw[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
#if KMAP
    const int j = s * 4 + q * U + u;
#else
    const int j = (s + u) * 4 + q;
#endif
    raw[u] = dec_ld_block<STREAM>(base, sh, j, jend, K);
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
#if KMAP
    const int j = s * 4 + q * U + u;
    uint4 nb;
    if (u + 1 < U) {
      nb = raw[u + 1];
    } else {
      nb = dec_shfl(raw[0], q < 3 ? lane + 1 : lane);
      if (q == 3) nb = dec_ld_block<STREAM>(base, sh, j + 1, j < jend ? jend : -1, K);
    }
#else
    const int j = (s + u) * 4 + q;
    // lanes q = 1..3 offer this step's block to the lane before; lane q = 0 the next step's to lane q = 3
    // (at the last step lane q = 3 loads it itself, and lane q = 0's offer goes unread)
    const uint4 next = raw[u + 1 < U ? u + 1 : u];
    uint4 nb = dec_shfl(q == 0 ? next : raw[u], q < 3 ? lane + 1 : lane - 3);
    if (q == 3 && u + 1 == U) nb = dec_ld_block<STREAM>(base, sh, j + 1, j < jend ? jend : -1, K);
#endif
    out[u] = dec_chunk(raw[u], nb, sh, j, jend, K);
  }
}
#endif

__device__ __forceinline__ void swab_load(SwabFrag& f, int s, int s1, int q, const unsigned short* const (&wlo)[RT],
                                          const unsigned short* const (&whi)[RT],
                                          const unsigned short* const (&xr)[NT], int K, bool vec) {
#if RAGGED
  (void)vec;
  const int jend = min(s1 * 4, (K + 7) >> 3);
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    uint4 lo[U], hi[U];
    swab_row_ragged<true>(lo, wlo[r], s, jend, q, K);
    swab_row_ragged<true>(hi, whi[r], s, jend, q, K);
#pragma unroll
    for (int u = 0; u < U; ++u) { f.lo[u][r] = lo[u]; f.hi[u][r] = hi[u]; }
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) {
    uint4 x[U];
    swab_row_ragged<false>(x, xr[j], s, jend, q, K);
#pragma unroll
    for (int u = 0; u < U; ++u) f.x[u][j] = x[u];
  }
#else
#pragma unroll
  for (int u = 0; u < U; ++u) {
#if KMAP
    const int k = s * 32 + (q * U + u) * 8;   // lane q owns U * 16 contiguous bytes of each row
#else
    const int k = (s + u) * 32 + 8 * q;       // step u: lanes q = 0..3 cover 64 contiguous bytes
#endif
    const bool in = k < s1 * 32 && k < K;
#pragma unroll
    for (int r = 0; r < RT; ++r) {
      if (!in) f.lo[u][r] = f.hi[u][r] = make_uint4(0u, 0u, 0u, 0u);
      else if (vec) { f.lo[u][r] = dec_ld_stream(wlo[r] + k); f.hi[u][r] = dec_ld_stream(whi[r] + k); }
      else { f.lo[u][r] = dec_ld_tail(wlo[r], k, K); f.hi[u][r] = dec_ld_tail(whi[r], k, K); }
    }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      if (!in) f.x[u][j] = make_uint4(0u, 0u, 0u, 0u);
      else if (vec) f.x[u][j] = dec_ld_keep(xr[j] + k);
      else f.x[u][j] = dec_ld_tail(xr[j], k, K);
    }
  }
#endif
}
// Two mmas per (step, weight tile, token tile): physical k 8q..8q+3, then 8q+4..8q+7 (see above).
__device__ __forceinline__ void swab_mma(float (&acc)[RT][NT][4], const SwabFrag& f) {
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int r = 0; r < RT; ++r)
#pragma unroll
      for (int j = 0; j < NT; ++j) {
        const u32 a0[4] = {f.lo[u][r].x, f.hi[u][r].x, f.lo[u][r].y, f.hi[u][r].y};
        const u32 b0[2] = {f.x[u][j].x, f.x[u][j].y};
        const u32 a1[4] = {f.lo[u][r].z, f.hi[u][r].z, f.lo[u][r].w, f.hi[u][r].w};
        const u32 b1[2] = {f.x[u][j].z, f.x[u][j].w};
        mma16816(acc[r][j], a0, b0);
        mma16816(acc[r][j], a1, b1);
      }
}

// A warp's accumulators into its row of the CTA's reduction buffer, fragment-major (index f * 32 + lane).
__device__ __forceinline__ void swab_stash(float* row, const float (&acc)[RT][NT][4], int lane) {
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) row[((r * NT + j) * 4 + c) * 32 + lane] = acc[r][j][c];
}

extern "C" __global__ void DEC_CLUSTER_DIMS DEC_BOUNDS(THREADS)
evo_swab(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B, unsigned short* __restrict__ C,
         int M_, int N_, int K_) {
  DEC_PROBLEM_SIZE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int groups = (M + 8 * NT - 1) / (8 * NT);
  const int nc = (blockIdx.x / groups) * ROWS_CTA, m0 = (blockIdx.x % groups) * (8 * NT);  // the CTA's tile
  const int n0 = nc + (WMAP ? warp * 16 * RT : 0);                                          // this warp's rows

  int s0, s1;  // this CTA's k32 steps
  dec_k_range((K + 31) >> 5, s0, s1);
  const bool vec = dec_vec16(A, B, K);  // false with RAGGED 1: the realigning path only (decode.cuh)

  const unsigned short* wlo[RT];
  const unsigned short* whi[RT];
  const unsigned short* xr[NT];
#pragma unroll
  for (int r = 0; r < RT; ++r) {
    wlo[r] = B + (long long)min(n0 + r * 16 + g, N - 1) * K;
    whi[r] = B + (long long)min(n0 + r * 16 + g + 8, N - 1) * K;
  }
#pragma unroll
  for (int j = 0; j < NT; ++j) xr[j] = A + (long long)min(m0 + j * 8 + g, M - 1) * K;

  float acc[RT][NT][4];
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[r][j][c] = 0.f;

#if PIPE
  // Ping-pong: the next iteration's fragments are in flight while this one's mmas run.
  SwabFrag f0, f1;
  swab_load(f0, s0 + WSTART, s1, q, wlo, whi, xr, K, vec);
  for (int s = s0 + WSTART; s < s1; s += 2 * WSTRIDE) {
    swab_load(f1, s + WSTRIDE, s1, q, wlo, whi, xr, K, vec);
    swab_mma(acc, f0);
    swab_load(f0, s + 2 * WSTRIDE, s1, q, wlo, whi, xr, K, vec);
    swab_mma(acc, f1);
  }
#else
  for (int s = s0 + WSTART; s < s1; s += WSTRIDE) {
    SwabFrag f;
    swab_load(f, s, s1, q, wlo, whi, xr, K, vec);
    swab_mma(acc, f);
  }
#endif

  // Fragment float c of (r, j) at this lane is C[m][n] with n = n0 + 16r + g + 8(c >= 2),
  // m = m0 + 8j + 2q + (c & 1). Index e = f * 32 + lane, f = (r * NT + j) * 4 + c.
#if WMAP && CLUSTER > 1
  // Each warp's own outputs (no sum over warps) meet those of the cluster's other CTAs: every CTA
  // finishes WARPS * FR * 32 / CLUSTER of them from all CTAs' red.
  __shared__ float red[WARPS][FR * 32];
  swab_stash(red[warp], acc, lane);
  dec_cluster_sync();
  const unsigned int rank = dec_cluster_rank();
  for (int e = rank + tid * CLUSTER; e < WARPS * FR * 32; e += THREADS * CLUSTER) {
    float s = 0.f;
#pragma unroll
    for (int z = 0; z < CLUSTER; ++z) s += dec_ld_peer(&red[0][0] + e, z);
    const int w = e / (FR * 32), f = (e >> 5) % FR, l = e & 31, c = f & 3, rj = f >> 2;
    const int n = nc + w * 16 * RT + (rj / NT) * 16 + (l >> 2) + (c >> 1) * 8;
    const int m = m0 + (rj % NT) * 8 + (l & 3) * 2 + (c & 1);
    if (n < N && m < M) C[(long long)m * N + n] = dec_f2h(s);
  }
  dec_cluster_sync();  // no CTA leaves while another still reads its shared memory
#elif !WMAP && (WARPS > 1 || CLUSTER > 1)
  __shared__ float red[WARPS][FR * 32];
  swab_stash(red[warp], acc, lane);
  __syncthreads();
#if CLUSTER > 1
  // warp sums land in red[0] (each element read and written by one thread), then the cluster's
  // CTAs each finish FR * 32 / CLUSTER of the outputs from every CTA's red[0]
  for (int e = tid; e < FR * 32; e += THREADS) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) s += red[w][e];
    red[0][e] = s;
  }
  dec_cluster_sync();
  const unsigned int rank = dec_cluster_rank();
  for (int e = rank + tid * CLUSTER; e < FR * 32; e += THREADS * CLUSTER) {
    float s = 0.f;
#pragma unroll
    for (int z = 0; z < CLUSTER; ++z) s += dec_ld_peer(&red[0][e], z);
#else
  for (int e = tid; e < FR * 32; e += THREADS) {
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) s += red[w][e];
#endif
    const int f = e >> 5, l = e & 31, c = f & 3, rj = f >> 2;
    const int n = n0 + (rj / NT) * 16 + (l >> 2) + (c >> 1) * 8;
    const int m = m0 + (rj % NT) * 8 + (l & 3) * 2 + (c & 1);
    if (n < N && m < M) C[(long long)m * N + n] = dec_f2h(s);
  }
#if CLUSTER > 1
  dec_cluster_sync();  // no CTA leaves while another still reads its shared memory
#endif
#else
#pragma unroll
  for (int r = 0; r < RT; ++r)
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int n = n0 + r * 16 + g + (c >> 1) * 8, m = m0 + j * 8 + 2 * q + (c & 1);
        if (n < N && m < M) C[(long long)m * N + n] = dec_f2h(acc[r][j][c]);
      }
#endif
}
