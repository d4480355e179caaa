// Split-K across the CTAs of a thread-block cluster, reduced through distributed shared memory
// (sm_90: one launch, no workspace, no second kernel): the K range each CTA of the cluster owns, the
// cluster-wide barrier and the load of a float from a peer CTA's shared memory. Shared by the decode
// families (gemv, swab, swpipe) and tiny. Needs CLUSTER defined (1 = no cluster: the helpers that
// only a cluster needs are left out).

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

