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
// pack2 (mma_sync.cuh), the shared-memory layout, the pipelined mainloop mma_mainloop and the
// direct epilogue mma_store_direct (mma_pipe.cuh, shared with streamk) and evo_splitk_reduce
// (splitk_reduce.cuh).

extern "C" __global__ void __launch_bounds__(THREADS)
evo_gemm(const half_t* __restrict__ A, const half_t* __restrict__ B, half_t* __restrict__ C,
         float* __restrict__ W, int M_, int N_, int K_, int lda_, int ldb_, int ldc_) {
  MMA_PROBLEM_SIZE;
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

  const bool vecA = mma_vec_a(A, K, lda), vecB = mma_vec_b(B, N, K, ldb);

  float acc[MI][NI][4];
  mma_zero(acc);

  const MmaTile tile{A, B, M, N, K, lda, ldb, vecA, vecB, m0, n0, sA, sB, sA32, sB32, tid, lane, wm0, wn0};
  mma_mainloop(acc, tile, kt0, nkt);

  // ---- epilogue ------------------------------------------------------------------------
#if SPLIT_K > 1 || EPI == EPI_smem
  const int g = lane >> 2, q = lane & 3;
#endif
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
  mma_store_direct(C, ldc, M, N, m0, n0, wm0, wn0, lane, acc);
#endif
}
