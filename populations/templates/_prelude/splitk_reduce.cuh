// Prelude shared by every family with a SPLIT_K knob: the reduce launch of split-K plans.
// Sums the SPLIT_K fp32 slices workspace[z][M][N] in a fixed order (deterministic) and writes
// C in fp16. Four elements per thread (plan grid: cdiv(M * N, 1024) blocks of 256), stored as
// one 8-byte word whatever M and N (C is contiguous: only its last 1-3 elements go one by one);
// 16-byte loads when M * N is a multiple of 4. Self-contained: no names of the template it joins.
#if SPLIT_K > 1
__device__ __forceinline__ unsigned int evo_reduce_pack2(float lo, float hi) {
  unsigned int r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
extern "C" __global__ void __launch_bounds__(256)
evo_splitk_reduce(const float* __restrict__ W, unsigned short* __restrict__ C, int M, int N) {
  const long long mn = (long long)M * N;
  const long long e0 = ((long long)blockIdx.x * 256 + threadIdx.x) * 4;
  if (e0 >= mn) return;
  if (e0 + 4 <= mn) {
    // C + e0 is 8-byte aligned for any M, N (e0 % 4 == 0, C 16-byte aligned): one 8-byte store a
    // thread, a warp's stores one contiguous 256-byte run. The slices W + z * mn are 16-byte
    // aligned only when mn % 4 == 0 (then 16-byte loads); otherwise four 4-byte loads (the warp's
    // loads still cover one contiguous run, the L1 merges them).
    float4 s;
    if (mn % 4 == 0) {
      s = *reinterpret_cast<const float4*>(W + e0);
#pragma unroll
      for (int z = 1; z < SPLIT_K; ++z) {
        const float4 v = *reinterpret_cast<const float4*>(W + z * mn + e0);
        s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
      }
    } else {
      s = make_float4(W[e0], W[e0 + 1], W[e0 + 2], W[e0 + 3]);
#pragma unroll
      for (int z = 1; z < SPLIT_K; ++z) {
        const float* w = W + z * mn + e0;
        s.x += w[0]; s.y += w[1]; s.z += w[2]; s.w += w[3];
      }
    }
    *reinterpret_cast<uint2*>(C + e0) = make_uint2(evo_reduce_pack2(s.x, s.y), evo_reduce_pack2(s.z, s.w));
  } else {  // the last 1-3 elements of C
    for (long long e = e0; e < mn; ++e) {
      float s = W[e];
#pragma unroll
      for (int z = 1; z < SPLIT_K; ++z) s += W[z * mn + e];
      C[e] = (unsigned short)(evo_reduce_pack2(s, 0.f) & 0xFFFFu);
    }
  }
}
#endif
