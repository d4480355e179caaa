// swpipe: swap-AB mma.sync GEMM with a cp.async pipeline that streams only the weights, for decode
// (2..16 tokens) on weights of several MB, TN, sm_80 and later.
//   C^T = B * A^T with mma.sync.m16n8k16: 16 weight rows on the mma's M side (RT tiles per CTA),
//   the tokens on its 8-wide N side (NT tiles). The CTA's tokens, for its whole K range, are
//   copied to shared memory once and stay there; the weights stream through STAGES shared-memory
//   stages of 16 * RT rows x KT halves (16-byte cp.async.cg, KT / 8 consecutive threads per row:
//   each warp reads contiguous row segments), so (STAGES - 1) stages of weight bytes are in flight
//   per CTA from the first instruction with almost no registers (the tokens ride along with the
//   first tile's stages). Fragments: ldmatrix from padded
//   rows (conflict-free). Each CTA walks TPC consecutive row tiles with one flattened pipeline, so
//   the next tile's first stages load during this tile's epilogue and the tokens are reused TPC
//   times. K: the WARPS / RT warps of one row tile split each stage's k16 steps (shared-memory
//   reduction), and on sm_90 the CLUSTER CTAs of a cluster split the K stages (distributed
//   shared memory: one launch, no workspace).
//   Grid: x = cdiv(cdiv(N, 16 * RT), TPC) * cdiv(M, 8 * NT) (token groups of one tile block
//   adjacent), z = CLUSTER; dynamic shared memory SMEM (template.toml), a function of the knobs only
//   (the token buffer holds XK columns), so one shared-memory size serves every shape whose CTA K range
//   fits XK columns (candidates are specialised: template.toml says why). Any M, N >= 1: edge
//   rows/tokens are clamped loads whose sums are never stored, K past the end is zero-filled, and
//   K % 8 != 0 or misaligned operands fill shared memory with 2-byte loads instead of cp.async.
// Knobs arrive as #defines (template.toml; THREADS is derived there); preludes: mma_sync.cuh, decode.cuh.

#define KSPLIT (WARPS / RT)        // warps sharing one 16-row tile
#define KQ (KT / 16)               // k16 steps per stage
#define WPITCH (KT + 8)            // halves per shared weight row (16-byte pad: conflict-free ldmatrix)
#define NTOK (8 * NT)              // tokens per CTA
#define STAGE_H (16 * RT * WPITCH) // halves per weight stage
#define WCHUNKS (2 * RT * KT)      // 16-byte chunks per weight stage
#define OUTS (NT * 128)            // accumulator floats per warp (NT n8 tiles x 4 x 32 lanes)

// One pipeline stage into shared memory: the weight rows [n0, n0 + 16 * RT) at k0 (KT halves each, into
// dst), and with tokens = true also the tokens' columns [kx, kx + KT) of this CTA's range (into xs at
// column kx - kbase). VEC: 16-byte cp.async, zeros past K; otherwise 2-byte loads and plain stores
// (K % 8 != 0 or misaligned operands). A template argument, so the two paths are separate code and
// the fallback's registers never count at the fast path's program points.
template <bool VEC>
__device__ __forceinline__ void swp_stage(unsigned short* dst, unsigned short* xs, int xpitch, bool tokens,
                                          const unsigned short* __restrict__ A, const unsigned short* __restrict__ B,
                                          int M, int N, int K, int m0, int n0, int k0, int kx, int kbase, int tid) {
  if (tokens) {
#pragma unroll
    for (int i0 = 0; i0 < NTOK * KT / 8; i0 += THREADS) {
      const int i = i0 + tid;
      if ((NTOK * KT / 8) % THREADS == 0 || i < NTOK * KT / 8) {
        const int j = i / (KT / 8), c = (i % (KT / 8)) * 8, k = kx + c;
        const unsigned short* row = A + (long long)min(m0 + j, M - 1) * K;
        unsigned short* to = xs + j * xpitch + (kx - kbase) + c;
        if (VEC) dec_cp16(dec_smem_addr(to), row + (k < K ? k : 0), k < K ? 16 : 0);
        else *reinterpret_cast<uint4*>(to) = dec_ld_tail(row, k, K);
      }
    }
  }
#pragma unroll
  for (int i0 = 0; i0 < WCHUNKS; i0 += THREADS) {
    const int i = i0 + tid;
    if (WCHUNKS % THREADS == 0 || i < WCHUNKS) {
      const int r = i / (KT / 8), c = (i % (KT / 8)) * 8, k = k0 + c;
      const unsigned short* row = B + (long long)min(n0 + r, N - 1) * K;
      unsigned short* to = dst + r * WPITCH + c;
      if (VEC) dec_cp16(dec_smem_addr(to), row + (k < K ? k : 0), k < K ? 16 : 0);
      else *reinterpret_cast<uint4*>(to) = dec_ld_tail(row, k, K);
    }
  }
}

extern "C" __global__ void DEC_CLUSTER_DIMS __launch_bounds__(THREADS)
evo_swpipe(const unsigned short* __restrict__ A, const unsigned short* __restrict__ B, unsigned short* __restrict__ C,
           int M_, int N_, int K_) {
  DEC_PROBLEM_SIZE;
  extern __shared__ __align__(16) unsigned short dsm[];
  __shared__ float red[WARPS][OUTS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int groups = (M + NTOK - 1) / NTOK, tiles = (N + 16 * RT - 1) / (16 * RT);
  const int t0 = (blockIdx.x / groups) * TPC, m0 = (blockIdx.x % groups) * NTOK;
  const int ntile = min(TPC, tiles - t0);
  int s0, s1;  // this CTA's K stages
  dec_k_range((K + KT - 1) / KT, s0, s1);
  const int nks = max(s1 - s0, 0), kbase = s0 * KT;
  const int xpitch = XK + 8;  // halves per shared token row (rows 16 bytes apart mod 128); nks * KT <= XK
  unsigned short* const ws = dsm;
  unsigned short* const xs = dsm + STAGES * STAGE_H;
  const bool vec = dec_vec16(A, B, K);

  // stage p = (tile lt, K stage lks) of the flattened walk, into buffer p % STAGES; during the first
  // tile each stage also brings the tokens of its KT columns into the resident token rows (same commit
  // group: no up-front token load to wait for), which later tiles reuse
  int lt = 0, lks = 0, lbuf = 0;
  const int total = ntile * nks;
  auto load_next = [&]() {
    const int n0 = (t0 + lt) * 16 * RT, k0 = kbase + lks * KT;
    unsigned short* const dst = ws + lbuf * STAGE_H;
    if (vec) swp_stage<true>(dst, xs, xpitch, lt == 0, A, B, M, N, K, m0, n0, k0, k0, kbase, tid);
    else swp_stage<false>(dst, xs, xpitch, lt == 0, A, B, M, N, K, m0, n0, k0, k0, kbase, tid);
    if (++lks == nks) { lks = 0; ++lt; }
    lbuf = lbuf + 1 == STAGES ? 0 : lbuf + 1;
  };
#pragma unroll 1
  for (int p = 0; p < STAGES - 1; ++p) {  // rolled: one copy of the load code, fewer live registers
    if (p < total) load_next();
    dec_cp_commit();
  }

  // warp roles: row tile rt, k16 steps kg, kg + KSPLIT, ... of every stage
  const int rt = warp % RT, kg = warp / RT;
  const unsigned int wfrag = dec_smem_addr(ws + (rt * 16 + (lane & 15)) * WPITCH + (lane >> 4) * 8);
  const unsigned int xfrag = dec_smem_addr(xs + ((lane & 7) + 8 * ((lane >> 4) & (NT - 1))) * xpitch + ((lane >> 3) & 1) * 8);
  float acc[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[j][c] = 0.f;
#if CLUSTER > 1
  __shared__ float part[RT * OUTS];
  const unsigned int rank = dec_cluster_rank();
#endif

  int buf = 0;
  for (int t = 0; t < ntile; ++t) {
    for (int ks = 0; ks < nks; ++ks) {
      dec_cp_wait<STAGES - 2>();
      __syncthreads();  // stage `buf` landed for every thread; buffer buf - 1 is free
      if (lt < ntile) load_next();  // stage it + STAGES - 1, into the buffer freed above
      dec_cp_commit();
      const unsigned int wb = wfrag + buf * STAGE_H * 2, xb = xfrag + ks * KT * 2;
#pragma unroll
      for (int q = kg; q < KQ; q += KSPLIT) {
        unsigned int a[4], x[4];
        dec_ldsm4(a, wb + q * 32);
        if (NT > 1) dec_ldsm4(x, xb + q * 32);
        else dec_ldsm2(x, xb + q * 32);
#pragma unroll
        for (int j = 0; j < NT; ++j) mma16816(acc[j], a, x + 2 * j);
      }
      buf = buf + 1 == STAGES ? 0 : buf + 1;
    }

    // epilogue of row tile t0 + t: the KSPLIT warps of each 16-row tile, then the cluster
#pragma unroll
    for (int j = 0; j < NT; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        red[warp][(j * 4 + c) * 32 + lane] = acc[j][c];
        acc[j][c] = 0.f;
      }
    __syncthreads();
    const int n0 = (t0 + t) * 16 * RT;
#if CLUSTER > 1
    for (int e = tid; e < RT * OUTS; e += THREADS) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < KSPLIT; ++w) s += red[(e / OUTS) + w * RT][e % OUTS];
      part[e] = s;
    }
    dec_cluster_sync();
    for (int e = rank + tid * CLUSTER; e < RT * OUTS; e += THREADS * CLUSTER) {
      float s = 0.f;
#pragma unroll
      for (int z = 0; z < CLUSTER; ++z) s += dec_ld_peer(&part[e], z);
#else
    for (int e = tid; e < RT * OUTS; e += THREADS) {
      float s = 0.f;
#pragma unroll
      for (int w = 0; w < KSPLIT; ++w) s += red[(e / OUTS) + w * RT][e % OUTS];
#endif
      const int f = (e % OUTS) >> 5, l = e & 31, c = f & 3;
      const int n = n0 + (e / OUTS) * 16 + (l >> 2) + (c >> 1) * 8, m = m0 + (f >> 2) * 8 + (l & 3) * 2 + (c & 1);
      if (n < N && m < M) C[(long long)m * N + n] = dec_f2h(s);
    }
#if CLUSTER > 1
    dec_cluster_sync();  // part[] and red[] are rewritten by the next tile; peers may still read them
#endif
  }
}
