// sm80_mma: a multistage HGEMM for sm_80 and later (runs on sm_90 too).
//   C[M,N] = A[M,K] * B, fp16 in/out, fp32 accumulation.
//   global -> shared: cp.async.cg 16-byte copies, STAGES deep (zero-filled with src-size 0 at
//                     ragged edges); an element-wise fallback when a leading dimension is not a
//                     multiple of 8 halves (then rows are not 16-byte aligned).
//   shared -> regs:   ldmatrix.x4 (.trans for the NN layout's K x N B tile).
//   math:             mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32.
//   split-K:          SPLIT_K > 1 writes fp32 partial tiles to workspace[SPLIT_K][M][N] and a
//                     second launch (evo_splitk_reduce) sums them in a fixed order into C.
// Knobs arrive as #defines (see template.toml); no includes, so NVRTC compiles it fast. The
// renderer prepends the _prelude files named in template.toml: half_t/u32/u64, mma16816, f2h,
// pack2 (mma_sync.cuh) and evo_splitk_reduce (splitk_reduce.cuh).

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

extern "C" __global__ void __launch_bounds__(THREADS)
evo_gemm(const half_t* __restrict__ A, const half_t* __restrict__ B, half_t* __restrict__ C,
         float* __restrict__ W, int M_, int N_, int K_, int lda_, int ldb_, int ldc_) {
#ifdef EVO_M
  const int M = EVO_M, N = EVO_N, K = EVO_K, lda = EVO_K, ldc = EVO_N;
#if defined(EVO_LAYOUT_TN)
  const int ldb = EVO_K;
#else
  const int ldb = EVO_N;
#endif
#else
  const int M = M_, N = N_, K = K_, lda = lda_, ldb = ldb_, ldc = ldc_;
#endif
  (void)ldc;
  extern __shared__ __align__(128) unsigned char smem[];
  half_t* sA = reinterpret_cast<half_t*>(smem);
  half_t* sB = sA + STAGES * A_STAGE;
  const u32 sA32 = smem_u32(sA), sB32 = smem_u32(sB);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;

  // Threadblock rasterization: groups of GROUP tile-rows (RASTER 0) or tile-columns (RASTER 1)
  // are walked together so neighbouring blocks share A or B panels in L2.
  const int gm = (M + BM - 1) / BM, gn = (N + BN - 1) / BN;
  const int t = blockIdx.x;
  int bm, bn;
#if RASTER == 0
  {
    const int width = GROUP * gn, first = (t / width) * GROUP;
    const int gs = min(gm - first, GROUP), r = t % width;
    bm = first + r % gs;
    bn = r / gs;
  }
#else
  {
    const int width = GROUP * gm, first = (t / width) * GROUP;
    const int gs = min(gn - first, GROUP), r = t % width;
    bn = first + r % gs;
    bm = r / gs;
  }
#endif
  const int m0 = bm * BM, n0 = bn * BN;

  const int ktiles = (K + BK - 1) / BK;
#if SPLIT_K > 1
  const int per = (ktiles + SPLIT_K - 1) / SPLIT_K;
  const int kt0 = blockIdx.z * per;
  const int nkt = max(min(kt0 + per, ktiles) - kt0, 0);
#else
  const int kt0 = 0, nkt = ktiles;
#endif

  const bool vecA = (K % 8 == 0) && (lda % 8 == 0) && ((reinterpret_cast<u64>(A) & 15) == 0);
#if defined(EVO_LAYOUT_TN)
  const bool vecB = (K % 8 == 0) && (ldb % 8 == 0) && ((reinterpret_cast<u64>(B) & 15) == 0);
#else
  const bool vecB = (N % 8 == 0) && (ldb % 8 == 0) && ((reinterpret_cast<u64>(B) & 15) == 0);
#endif

  auto load_stage = [&](int stage, int kt) {
    const int k0 = kt * BK;
    load_tile<BM, BK>(sA32 + stage * A_STAGE * 2, sA + stage * A_STAGE, A, lda, m0, M, k0, K, vecA, tid);
#if defined(EVO_LAYOUT_TN)
    load_tile<BN, BK>(sB32 + stage * B_STAGE * 2, sB + stage * B_STAGE, B, ldb, n0, N, k0, K, vecB, tid);
#else
    load_tile<BK, BN>(sB32 + stage * B_STAGE * 2, sB + stage * B_STAGE, B, ldb, k0, K, n0, N, vecB, tid);
#endif
  };

  float acc[MI][NI][4];
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.f;

#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nkt) load_stage(s, kt0 + s);
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
    if (it + STAGES - 1 < nkt) load_stage(ws, kt0 + it + STAGES - 1);
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

  // ---- epilogue ------------------------------------------------------------------------
  const int g = lane >> 2, q = lane & 3;
#if SPLIT_K > 1
  // fp32 partials of this split into its own slice of the workspace.
  float* Wz = W + (long long)blockIdx.z * M * N;
  const bool even = (N % 2 == 0);
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + wm0 + i * 16 + g + h * 8, col = n0 + wn0 + j * 8 + q * 2;
        if (row >= M) continue;
        float* p = Wz + (long long)row * N + col;
        if (even && col < N) {
          *reinterpret_cast<float2*>(p) = make_float2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
        } else {
          if (col < N) p[0] = acc[i][j][2 * h];
          if (col + 1 < N) p[1] = acc[i][j][2 * h + 1];
        }
      }
#elif EPI == EPI_smem
  // Stage the fp16 tile in shared memory (rows padded by 16 bytes), then 16-byte coalesced stores.
  constexpr int CROW = BN + 8;
  cp_async_wait<0>();
  __syncthreads();
  half_t* sC = reinterpret_cast<half_t*>(smem);
#pragma unroll
  for (int i = 0; i < MI; ++i)
#pragma unroll
    for (int j = 0; j < NI; ++j)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int r = wm0 + i * 16 + g + h * 8, c = wn0 + j * 8 + q * 2;
        *reinterpret_cast<u32*>(sC + r * CROW + c) = pack2(acc[i][j][2 * h], acc[i][j][2 * h + 1]);
      }
  __syncthreads();
  const bool vecC = (N % 8 == 0) && (ldc % 8 == 0) && ((reinterpret_cast<u64>(C) & 15) == 0);
  constexpr int CCHUNKS = BM * BN / 8;
#pragma unroll
  for (int it = 0; it < (CCHUNKS + THREADS - 1) / THREADS; ++it) {
    const int i = tid + it * THREADS;
    if (CCHUNKS % THREADS != 0 && i >= CCHUNKS) break;
    const int r = i / (BN / 8), c = (i % (BN / 8)) * 8;
    const int row = m0 + r, col = n0 + c;
    if (row >= M || col >= N) continue;
    half_t* p = C + (long long)row * ldc + col;
    if (vecC) {
      *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(sC + r * CROW + c);
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if (col + e < N) p[e] = sC[r * CROW + c + e];
    }
  }
#else
  // Direct: each thread stores its fragment pairs (4-byte stores when rows are 4-byte aligned).
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
#endif
}
