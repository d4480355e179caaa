// Prelude shared by every family with a SPLIT_K knob: the reduce launch of split-K plans.
// Sums the SPLIT_K fp32 slices workspace[z][M][N] in a fixed order (deterministic) and writes
// C in fp16. Four elements per thread, stored as one 8-byte word whatever M and N (C is
// contiguous: only its last 1-3 elements go one by one); 16-byte loads when M * N is a multiple
// of 4. SK_LANES (a template's derived value of SPLIT_K) threads share each group of four: lane z
// sums slices z, z + SK_LANES, ... and the lanes meet in shared memory in lane order (still one
// fixed order). With one lane (SPLIT_K < 8) a block covers 1024 elements; with 8, 128, so a small
// C with many slices (few tiles, deep K: 2.9 MB of partials over 12 blocks at 118x96x16384 split
// 64) is read by 8x the blocks. Plan grid: cdiv(M * N, 4 * (256 / SK_LANES)) blocks of 256.
// Self-contained: no names of the template it joins but SPLIT_K and SK_LANES.
#if SPLIT_K > 1
__device__ __forceinline__ unsigned int evo_reduce_pack2(float lo, float hi) {
  unsigned int r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#if SK_LANES > 1
// Slices z = lane, lane + SK_LANES, ... of the four elements at e0 (fewer at C's end), summed in z
// order; a compile-time trip count (predicated past SPLIT_K) so that all of a lane's loads are issued
// before its adds.
constexpr int EVO_REDUCE_STEPS = (SPLIT_K + SK_LANES - 1) / SK_LANES;
__device__ __forceinline__ float4 evo_reduce_lane(const float* __restrict__ W, long long mn, long long e0, int lane) {
  float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
  if (e0 + 4 <= mn && mn % 4 == 0) {
    float4 v[EVO_REDUCE_STEPS];  // every load issued before the first add: one round trip
#pragma unroll
    for (int i = 0; i < EVO_REDUCE_STEPS; ++i) {
      const int z = lane + i * SK_LANES;
      v[i] = (SPLIT_K % SK_LANES == 0 || z < SPLIT_K) ? *reinterpret_cast<const float4*>(W + z * mn + e0)
                                                      : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < EVO_REDUCE_STEPS; ++i) {
      s.x += v[i].x; s.y += v[i].y; s.z += v[i].z; s.w += v[i].w;
    }
  } else if (e0 < mn) {
    const int cnt = (int)min(4LL, mn - e0);
#pragma unroll
    for (int i = 0; i < EVO_REDUCE_STEPS; ++i) {
      const int z = lane + i * SK_LANES;
      if (z < SPLIT_K) {
        const float* w = W + z * mn + e0;
        s.x += w[0];
        if (cnt > 1) s.y += w[1];
        if (cnt > 2) s.z += w[2];
        if (cnt > 3) s.w += w[3];
      }
    }
  }
  return s;
}
#endif

extern "C" __global__ void __launch_bounds__(256)
evo_splitk_reduce(const float* __restrict__ W, unsigned short* __restrict__ C, int M, int N) {
  const long long mn = (long long)M * N;
#if SK_LANES > 1
  // 256 / SK_LANES groups of four per block; a warp's threads take consecutive groups of one lane,
  // so each load instruction reads one contiguous 512-byte run of a slice
  constexpr int GROUPS = 256 / SK_LANES;
  __shared__ float4 part[SK_LANES][GROUPS];
  const int g = threadIdx.x % GROUPS, lane = threadIdx.x / GROUPS;
  const long long e0 = ((long long)blockIdx.x * GROUPS + g) * 4;
  part[lane][g] = evo_reduce_lane(W, mn, e0, lane);
  __syncthreads();  // every thread reaches it: no early return above
  if (lane != 0 || e0 >= mn) return;
  float4 s = part[0][g];
#pragma unroll
  for (int q = 1; q < SK_LANES; ++q) {
    const float4 v = part[q][g];
    s.x += v.x; s.y += v.y; s.z += v.z; s.w += v.w;
  }
  if (e0 + 4 <= mn) {
    *reinterpret_cast<uint2*>(C + e0) = make_uint2(evo_reduce_pack2(s.x, s.y), evo_reduce_pack2(s.z, s.w));
  } else {  // the last 1-3 elements of C
    const float t[4] = {s.x, s.y, s.z, s.w};
    for (long long e = e0; e < mn; ++e) C[e] = (unsigned short)(evo_reduce_pack2(t[e - e0], 0.f) & 0xFFFFu);
  }
#else
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
#endif  // SK_LANES
}
#endif
