// Prelude shared by the mma.sync tile families (sm80_mma, streamk): the multistage cp.async +
// ldmatrix + mma.sync m16n8k16 mainloop over the K tiles [kt0, kt0 + nkt) of one BM x BN block
// tile, its shared-memory layout (padded or XOR-swizzled rows) and the direct fp16 epilogue.
// Needs the knobs BM, BN, BK, WM, WN, STAGES, PAD, SWIZZLE, THREADS (KUNROLL optional: 1), the
// layout macro EVO_LAYOUT_TN (else NN) and mma_sync.cuh before it.
#ifndef KUNROLL
#define KUNROLL 1
#endif

#define WARPS_M (BM / WM)
#define WARPS_N (BN / WN)
#define MI (WM / 16)
#define NI (WN / 8)
#if defined(EVO_LAYOUT_TN)
#define B_ROWS BN          // B tile stored [n][k]
#define B_COLS BK
#else
#define B_ROWS BK          // B tile stored [k][n]
#define B_COLS BN
#endif
#define A_STAGE (BM * (BK + PAD))
#define B_STAGE (B_ROWS * (B_COLS + PAD))

// Offset (in halves) of element (row, col) of a ROWS x COLS tile in shared memory; col is a
// multiple of 8 (one 16-byte chunk). SWIZZLE XORs the chunk index with the row's position in
// its 128-byte line group, so the 8 row addresses of one ldmatrix phase hit 8 distinct bank
// groups; PAD shifts each row by 16 bytes for the same effect.
template <int COLS>
__device__ __forceinline__ int tile_off(int row, int col) {
#if SWIZZLE
  constexpr int C = COLS / 8;
  constexpr int CS = C < 8 ? C : 8;
  constexpr int RPL = 8 / CS;
  return row * COLS + ((((col >> 3) ^ ((row / RPL) % CS))) << 3);
#else
  return row * (COLS + PAD) + col;
#endif
}

__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 r;
  asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(r) : "l"(p));
  return r;
}

__device__ __forceinline__ void cp_async16(u32 dst, const void* src, int bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ void ldsm_x4(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_t(u32* r, u32 addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}


// Copy the ROWS x COLS tile g[row0.., col0..] (row-major, leading dimension ld) into shared
// memory at sbase, zero-filling rows >= nrows and cols >= ncols. vec: 16-byte cp.async (needs
// ld % 8 == 0, ncols % 8 == 0 and a 16-byte aligned base); else element-wise loads and stores.
template <int ROWS, int COLS>
__device__ __forceinline__ void load_tile(u32 sbase, half_t* sptr, const half_t* __restrict__ g, int ld,
                                          int row0, int nrows, int col0, int ncols, bool vec, int tid) {
  constexpr int CPR = COLS / 8;
  constexpr int CHUNKS = ROWS * CPR;
  constexpr int ITERS = (CHUNKS + THREADS - 1) / THREADS;  // compile-time trip count: fully unrolled
  if (vec) {
#pragma unroll
    for (int it = 0; it < ITERS; ++it) {
      const int i = tid + it * THREADS;
      if (CHUNKS % THREADS != 0 && i >= CHUNKS) break;
      const int r = i / CPR, c = (i % CPR) * 8;
      const int gr = row0 + r, gc = col0 + c;
      const bool in = gr < nrows && gc < ncols;
      const half_t* src = in ? g + (long long)gr * ld + gc : g;
      cp_async16(sbase + 2 * tile_off<COLS>(r, c), src, in ? 16 : 0);
    }
  } else {
    // The slow path (unaligned rows): kept rolled so its many scalar loads do not compete with
    // the accumulators for registers.
#pragma unroll 1
    for (int it = 0; it < ITERS; ++it) {
      const int i = tid + it * THREADS;
      if (CHUNKS % THREADS != 0 && i >= CHUNKS) break;
      const int r = i / CPR, c = (i % CPR) * 8;
      const int gr = row0 + r, gc = col0 + c;
      u32 w[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const half_t lo = (gr < nrows && gc + 2 * j < ncols) ? g[(long long)gr * ld + gc + 2 * j] : (half_t)0;
        const half_t hi = (gr < nrows && gc + 2 * j + 1 < ncols) ? g[(long long)gr * ld + gc + 2 * j + 1] : (half_t)0;
        w[j] = (u32)lo | ((u32)hi << 16);
      }
      *reinterpret_cast<uint4*>(sptr + tile_off<COLS>(r, c)) = make_uint4(w[0], w[1], w[2], w[3]);
    }
  }
}

// 16-byte cp.async copies are legal when rows start 16-byte aligned: A's rows hold K halves; B's
// rows hold K (TN, B stored N x K) or N (NN) halves.
__device__ __forceinline__ bool mma_vec_a(const half_t* A, int K, int lda) {
  return (K % 8 == 0) && (lda % 8 == 0) && ((reinterpret_cast<u64>(A) & 15) == 0);
}
__device__ __forceinline__ bool mma_vec_b(const half_t* B, int N, int K, int ldb) {
#if defined(EVO_LAYOUT_TN)
  (void)N;
  return (K % 8 == 0) && (ldb % 8 == 0) && ((reinterpret_cast<u64>(B) & 15) == 0);
#else
  (void)K;
  return (N % 8 == 0) && (ldb % 8 == 0) && ((reinterpret_cast<u64>(B) & 15) == 0);
#endif
}
__device__ __forceinline__ void mma_zero(float (&acc)[MI][NI][4]) {
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;
}

// Where one CTA's operands and pipeline live: global operands with their leading dimensions and
// 16-byte-copy eligibility, the block tile's origin, the shared-memory stages, the thread's warp tile.
struct MmaTile {
  const half_t* A;
  const half_t* B;
  int M, N, K, lda, ldb;
  bool vecA, vecB;
  int m0, n0;
  half_t* sA;
  half_t* sB;
  u32 sA32, sB32;
  int tid, lane, wm0, wn0;
};

// Stage `stage` <- the A and B tiles of K tile kt (cp.async, not yet committed).
__device__ __forceinline__ void mma_load_stage(const MmaTile& t, int stage, int kt) {
  const int k0 = kt * BK;
  load_tile<BM, BK>(t.sA32 + stage * A_STAGE * 2, t.sA + stage * A_STAGE, t.A, t.lda, t.m0, t.M, k0, t.K, t.vecA, t.tid);
#if defined(EVO_LAYOUT_TN)
  load_tile<BN, BK>(t.sB32 + stage * B_STAGE * 2, t.sB + stage * B_STAGE, t.B, t.ldb, t.n0, t.N, k0, t.K, t.vecB, t.tid);
#else
  load_tile<BK, BN>(t.sB32 + stage * B_STAGE * 2, t.sB + stage * B_STAGE, t.B, t.ldb, k0, t.K, t.n0, t.N, t.vecB, t.tid);
#endif
}

// acc += the block tile's product over K tiles [kt0, kt0 + nkt): a STAGES-deep cp.async pipeline,
// ldmatrix fragments, mma.sync. Leaves only empty cp.async groups in flight; a caller that reuses
// the stages for another range first waits for them and synchronises the CTA (mma_pipe_drain).
__device__ __forceinline__ void mma_mainloop(float (&acc)[MI][NI][4], const MmaTile& t, int kt0, int nkt) {
  const int lane = t.lane, wm0 = t.wm0, wn0 = t.wn0;
  const u32 sA32 = t.sA32, sB32 = t.sB32;
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nkt) mma_load_stage(t, s, kt0 + s);
    cp_async_commit();
  }
  int rs = 0, ws = STAGES - 1;
  // The knob reaches the pragma through a constant: nvcc does not macro-expand pragma
  // arguments (`#pragma unroll KUNROLL` is an error there), NVRTC does; both take an integral
  // constant expression and emit the same code as a literal.
  constexpr int kUnroll = KUNROLL;
#pragma unroll kUnroll
  for (int it = 0; it < nkt; ++it) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    if (it + STAGES - 1 < nkt) mma_load_stage(t, ws, kt0 + it + STAGES - 1);
    cp_async_commit();
    ws = (ws + 1 == STAGES) ? 0 : ws + 1;

    const u32 aS = sA32 + rs * A_STAGE * 2, bS = sB32 + rs * B_STAGE * 2;
#pragma unroll
    for (int kk = 0; kk < BK; kk += 16) {
      u32 af[MI][4], bf[NI][2];
#pragma unroll
      for (int i = 0; i < MI; ++i)
        ldsm_x4(af[i], aS + 2 * tile_off<BK>(wm0 + i * 16 + (lane & 15), kk + (lane >> 4) * 8));
#pragma unroll
      for (int j = 0; j < NI / 2; ++j) {
        u32 r[4];
#if defined(EVO_LAYOUT_TN)
        ldsm_x4(r, bS + 2 * tile_off<BK>(wn0 + j * 16 + (lane >> 4) * 8 + (lane & 7), kk + ((lane >> 3) & 1) * 8));
#else
        ldsm_x4_t(r, bS + 2 * tile_off<BN>(kk + (lane & 15), wn0 + j * 16 + (lane >> 4) * 8));
#endif
        bf[2 * j][0] = r[0];
        bf[2 * j][1] = r[1];
        bf[2 * j + 1][0] = r[2];
        bf[2 * j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NI; ++j) mma16816(acc[i][j], af[i], bf[j]);
    }
    rs = (rs + 1 == STAGES) ? 0 : rs + 1;
  }
}

// Before the stages are refilled for another K range (or reused by an epilogue): every copy landed
// and every warp done reading them.
__device__ __forceinline__ void mma_pipe_drain() {
  cp_async_wait<0>();
  __syncthreads();
}

// The direct epilogue: each thread stores its fragment pairs of the block tile at (m0, n0) as fp16
// (4-byte stores when rows are 4-byte aligned), nothing outside M x N.
__device__ __forceinline__ void mma_store_direct(half_t* __restrict__ C, int ldc, int M, int N, int m0, int n0,
                                                 int wm0, int wn0, int lane, const float (&acc)[MI][NI][4]) {
  const int g = lane >> 2, q = lane & 3;
  const bool even = (N % 2 == 0) && (ldc % 2 == 0) && ((reinterpret_cast<u64>(C) & 3) == 0);
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm0 + i * 16 + g + h * 8, col = n0 + wn0 + j * 8 + q * 2;
        if (row >= M || col >= N) continue;
        half_t* p = C + (long long)row * ldc + col;
        if (even) {
          *reinterpret_cast<u32*>(p) = pack2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        } else {
          p[0] = f2h(acc[i][j][2 * h]);
          if (col + 1 < N) p[1] = f2h(acc[i][j][2 * h + 1]);
        }
      }
}
