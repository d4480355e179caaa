// Prelude shared by the weight-streaming (decode) families, gemv and swab: 16-byte loads of
// operands that are read once (weights) or by many CTAs (tokens), fp16 <-> fp32 helpers, and the
// split-K reduction across the CTAs of a thread-block cluster through distributed shared memory
// (sm_90: one launch, no workspace, no second kernel). Needs CLUSTER defined (1 = no cluster).

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
// Eight halves of a row at [k, k + 8), zero past kend: the ragged or misaligned path (2-byte loads).
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

// Kernels of a K-splitting cluster carry the compile-time cluster shape (a plain launch honours it).
#if CLUSTER > 1
#define DEC_CLUSTER_DIMS __cluster_dims__(1, 1, CLUSTER)
#else
#define DEC_CLUSTER_DIMS
#endif

// The part [lo, hi) of `units` K units (chunks, steps) this CTA owns: all of them, or with a cluster
// (grid z = CLUSTER) an even split by blockIdx.z.
__device__ __forceinline__ void dec_k_range(int units, int& lo, int& hi) {
#if CLUSTER > 1
  const int per = (units + CLUSTER - 1) / CLUSTER;
  lo = blockIdx.z * per;
  hi = min(lo + per, units);
#else
  lo = 0;
  hi = units;
#endif
}
// 16-byte loads are legal when every row starts 16-byte aligned: K % 8 == 0 and aligned base pointers.
__device__ __forceinline__ bool dec_vec16(const void* A, const void* B, int K) {
  return (K % 8 == 0) && (((unsigned long long)A | (unsigned long long)B) & 15) == 0;
}

#if CLUSTER > 1
// Cluster-wide barrier with release/acquire semantics: shared-memory writes before it are visible
// to every CTA of the cluster after it.
__device__ __forceinline__ void dec_cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\n barrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ unsigned int dec_cluster_rank() {
  unsigned int r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
// The float at the same shared-memory offset as `local`, in the shared memory of CTA `rank`.
__device__ __forceinline__ float dec_ld_peer(const float* local, unsigned int rank) {
  unsigned int mine = (unsigned int)__cvta_generic_to_shared(local), theirs;
  float v;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(theirs) : "r"(mine), "r"(rank));
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(theirs) : "memory");
  return v;
}
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
