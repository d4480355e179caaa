// Prelude shared by the weight-streaming (decode) families, gemv and swab: 16-byte loads of
// operands that are read once (weights) or by many CTAs (tokens), fp16 <-> fp32 helpers. Their
// split-K across the CTAs of a cluster is cluster_k.cuh's (listed before this file).

// The problem size inside a kernel: the rendered constants of a specialised candidate (EVO_M,
// EVO_N, EVO_K, so every loop bound folds), the launch arguments M_, N_, K_ otherwise.
#ifdef EVO_M
#define DEC_PROBLEM_SIZE const int M = EVO_M, N = EVO_N, K = EVO_K
#else
#define DEC_PROBLEM_SIZE const int M = M_, N = N_, K = K_
#endif

// Weights are streamed exactly once: read-only path, no L1 allocation (keeps L1 for the tokens).
// Not volatile: the operands are read-only for the whole kernel, so ptxas may schedule these loads
// freely (hoist them ahead of arithmetic).
__device__ __forceinline__ uint4 dec_ld_stream(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Tokens are small and read by every CTA: read-only path through L1.
__device__ __forceinline__ uint4 dec_ld_keep(const void* p) {
  uint4 v;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// The same two loads as volatile asm (kept in program order by NVVM). gemv's ISSUE loop uses them:
// on sm_90a its SASS matched the non-volatile forms, but ptxas for sm_80 then spilled one register
// at ROWS 2 (40 registers, 4 bytes), which these avoid.
__device__ __forceinline__ uint4 dec_ld_stream_v(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 dec_ld_keep_v(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
// Eight halves of a row at [k, k + 8), zero past kend, in 2-byte loads: the fallback of kernels built
// without the realigning path (RAGGED 0) for rows that do not start on 16 bytes.
__device__ __forceinline__ uint4 dec_ld_tail(const unsigned short* __restrict__ row, int k, int kend) {
  unsigned int w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const unsigned int lo = k + 2 * j < kend ? row[k + 2 * j] : 0u;
    const unsigned int hi = k + 2 * j + 1 < kend ? row[k + 2 * j + 1] : 0u;
    w[j] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}
// ---- the realigning path: rows that do not start on 16 bytes (K % 8 != 0, a misaligned base) ----
// A row at p is read as 16-byte blocks of the aligned grid below it (base = p rounded down to 16
// bytes, s = halves of the first block before the row's first). Logical chunk j (halves [8j, 8j + 8)
// of the row) is halves s..s+7 of blocks j and j + 1: each lane of a warp loads block j of its own
// chunk, takes block j + 1 from the next lane (lane 31 loads it), and shifts the pair by s halves.
// Every load is one aligned 16-byte load of a block that holds at least one half of the row, so it
// never touches a page the row does not; halves past the row (the next row, a guard band) are
// zeroed in both operands before any FMA, so no NaN or Inf from outside the matrix reaches a sum.
// The whole warp must call it together (shuffles): callers keep their K loops warp-uniform. The
// shift, the tail mask and the grid are _prelude/realign.cuh's (sm90_wgmma's RAGGED producer uses them too).

// Block j of a row's grid (shift s, K halves) where it holds a half of the row (8j < s + K) and is
// needed (j <= jneed: the last logical chunk, jneed - 1, may end in block jneed); zeros otherwise.
// STREAM: the weights' load (no L1 allocation), else the tokens' (through L1).
template <bool STREAM>
__device__ __forceinline__ uint4 dec_ld_block(const uint4* base, int s, int j, int jneed, int K) {
  if (j > jneed || 8 * j >= s + K) return make_uint4(0u, 0u, 0u, 0u);
  return STREAM ? dec_ld_stream(base + j) : dec_ld_keep(base + j);
}
__device__ __forceinline__ uint4 dec_shfl(uint4 v, int src) {
  return make_uint4(__shfl_sync(0xffffffffu, v.x, src), __shfl_sync(0xffffffffu, v.y, src),
                    __shfl_sync(0xffffffffu, v.z, src), __shfl_sync(0xffffffffu, v.w, src));
}
// Logical chunk j (halves [8j, 8j + 8) of the row) from its blocks j and j + 1: zeros where j >= jend
// (the caller's K range ends there), the halves past K zeroed.
__device__ __forceinline__ uint4 dec_chunk(uint4 lo, uint4 hi, int s, int j, int jend, int K) {
  if (j >= jend) return make_uint4(0u, 0u, 0u, 0u);
  const uint4 v = dec_realign(lo, hi, s);
  return 8 * j + 8 > K ? dec_keep(v, K - 8 * j) : v;
}
// Logical chunk j of the row at p, lane j's neighbour (chunk j + 1) on lane + 1 (gemv's layout), in
// two steps: dec_raw issues the loads (this lane's block j; on lane 31 also block j + 1, which no
// lane holds) and returns; dec_join shuffles and shifts. A caller issues every chunk's dec_raw of an
// iteration before the first dec_join, so all the loads are in flight together: one load, shuffle
// and shift after another kept a single 16-byte load in flight a thread (each shuffle waits for its
// load, and ptxas placed the next load after it: gemv's SASS at 1x13696x2756, 0.52x of cuBLAS).
struct DecRaw {
  uint4 lo, hi31;  // block j; block j + 1 on lane 31 (zeros elsewhere)
  int s;           // the row's shift on its aligned grid
};
template <bool STREAM>
__device__ __forceinline__ DecRaw dec_raw(const unsigned short* p, int j, int jend, int K) {
  const uint4* base;
  DecRaw r;
  dec_grid(p, base, r.s);
  r.lo = dec_ld_block<STREAM>(base, r.s, j, jend, K);
  r.hi31 = (threadIdx.x & 31) == 31 ? dec_ld_block<STREAM>(base, r.s, j + 1, j < jend ? jend : -1, K)
                                    : make_uint4(0u, 0u, 0u, 0u);
  return r;
}
// Logical chunk j from dec_raw's loads: every lane of the warp calls it together (shuffles).
__device__ __forceinline__ uint4 dec_join(const DecRaw& r, int j, int jend, int K) {
  const int lane = (int)(threadIdx.x & 31);
  uint4 hi = dec_shfl(r.lo, lane < 31 ? lane + 1 : lane);
  if (lane == 31) hi = r.hi31;
  return dec_chunk(r.lo, hi, r.s, j, jend, K);
}

__device__ __forceinline__ float2 dec_h2f2(unsigned int v) {
  float2 f;
  asm("{.reg .f16 lo, hi;\n mov.b32 {lo, hi}, %2;\n cvt.f32.f16 %0, lo;\n cvt.f32.f16 %1, hi;}"
      : "=f"(f.x), "=f"(f.y) : "r"(v));
  return f;
}
__device__ __forceinline__ unsigned short dec_f2h(float x) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}

// 16-byte loads are legal when every row starts 16-byte aligned: K % 8 == 0 and aligned base pointers.
// A kernel built with RAGGED 1 reads every row through the realigning path (one K loop, registers
// for it alone), so for it the answer is a constant false and the 16-byte loop is never compiled in.
__device__ __forceinline__ bool dec_vec16(const void* A, const void* B, int K) {
#if defined(RAGGED) && RAGGED
  (void)A, (void)B, (void)K;
  return false;
#else
  return (K % 8 == 0) && (((unsigned long long)A | (unsigned long long)B) & 15) == 0;
#endif
}
// Launch bounds of the decode kernels: the realigning path's shifts hold more registers live than
// ptxas's default budget for these kernels (gemv and swab spilled at 64-80 and 128), so RAGGED 1
// kernels promise only one resident CTA.
#if defined(RAGGED) && RAGGED
#define DEC_BOUNDS(threads) __launch_bounds__(threads, 1)
#else
#define DEC_BOUNDS(threads) __launch_bounds__(threads)
#endif

// ---- shared-memory staging (swpipe): 16-byte cp.async with zero fill, ldmatrix fragments ----
__device__ __forceinline__ unsigned int dec_smem_addr(const void* p) {
  return (unsigned int)__cvta_generic_to_shared(p);
}
// Copy 16 bytes global -> shared without a register round trip; `bytes` = 0 writes zeros (K past
// the end). The weights go L2-only (.cg); L2PF = 1 (a knob) asks L2 to fetch the 256-byte line around it.
__device__ __forceinline__ void dec_cp16(unsigned int dst, const void* src, int bytes) {
#if defined(L2PF) && L2PF
  asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void dec_cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
// Wait until at most PENDING committed groups are still in flight.
template <int PENDING>
__device__ __forceinline__ void dec_cp_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(PENDING) : "memory"); }
// ldmatrix: four (x4) or two (x2) 8x8 b16 matrices, row addresses from lanes 0-31 (0-15 for x2).
__device__ __forceinline__ void dec_ldsm4(unsigned int (&r)[4], unsigned int addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr) : "memory");
}
__device__ __forceinline__ void dec_ldsm2(unsigned int (&r)[4], unsigned int addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(addr) : "memory");
  r[2] = r[3] = 0u;
}
