// streamk: a persistent stream-K HGEMM over the mma.sync mainloop, for mid shapes (M 64-512 with
// large N * K) and any shape whose last wave of tiles would leave SMs idle. One launch.
//   Work: T = cdiv(M, BM) * cdiv(N, BN) block tiles of I = cdiv(K, BK) MAC-loop iterations each.
//   The grid is G persistent CTAs (SMS * CPS, at most T * I). The first DP_TILES tiles are
//   data-parallel (CTA g takes tiles g, g + G, ...: whole waves); the other SK_TILES tiles form one
//   range of SK_TILES * I iterations that the G CTAs share evenly: CTA g takes iterations
//   [g * S / G, (g + 1) * S / G) of S, walking them in order, one segment per tile it touches.
//   DP = 0 streams every tile, DP = 1 keeps all full waves but one data-parallel, DP = 2 streams
//   only the remainder tiles (streamk_split; tests/test_template_streamk.py holds its Python model
//   and compiles the text between the schedule markers below for the host to compare).
//   Fix-up: a segment that starts at its tile's first iteration belongs to the tile's owner; any
//   other segment is the first segment of a peer CTA, which writes its fp32 accumulators to its
//   own workspace slot (fragment order, coalesced) and then publishes a flag. The owner, which
//   reaches the tile at the end of its own range (after its peers began theirs), waits for each
//   peer's flag, adds the slots in CTA order (deterministic), writes C and clears the flags.
//   Peers publish before they wait for anything, and a CTA waits only for higher-numbered CTAs,
//   so the waits cannot close a cycle; the CPS constraints keep all G CTAs resident on SMS SMs
//   (on fewer SMs, CTAs start in order and lower ones finish first). No zeroed workspace: a flag counts only when it holds
//   SK_READY (a value no byte fill produces) and the owner returns it to 0.
//   Workspace: G slots of BM * BN fp32, then G 32-bit flags.
// Knobs arrive as #defines (template.toml); prelude: mma_sync.cuh, mma_pipe.cuh (the shared
// multistage cp.async + ldmatrix + mma.sync mainloop, layout and direct epilogue of sm80_mma).

#define SK_READY 0x9E3779B9u  // four distinct bytes: no repeated-byte fill of the workspace equals it
#define FRAG (MI * NI * 4)    // fp32 accumulators per thread

// ---- schedule: begin
// The tiles before the stream-K range (whole waves of G) and the stream-K tiles after them.
__device__ __forceinline__ void streamk_split(int tiles, int G, int& dp_tiles, int& sk_tiles) {
#if DP == 1
  const int waves = tiles / G > 0 ? tiles / G - 1 : 0;
#elif DP == 2
  const int waves = tiles / G;
#else
  const int waves = 0;
#endif
  dp_tiles = waves * G;
  sk_tiles = tiles - dp_tiles;
}
// The first stream-K iteration of CTA g: g * S / G (the product in 64 bits; S < 2^31, template.toml).
__device__ __forceinline__ int streamk_begin(int g, int S, int G) { return (int)((long long)g * S / G); }
// ---- schedule: end

// Partial sums go through L2 only (.cg): written and read by different CTAs within the launch.
__device__ __forceinline__ void sk_store4(float* p, float a, float b, float c, float d) {
  asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
__device__ __forceinline__ float4 sk_load4(const float* p) {
  float4 v;
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void sk_publish(unsigned int* flag) {
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(SK_READY) : "memory");
}
__device__ __forceinline__ unsigned int sk_peek(const unsigned int* flag) {
  unsigned int v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
  return v;
}

extern "C" __global__ void __launch_bounds__(THREADS)
evo_streamk(const half_t* __restrict__ A, const half_t* __restrict__ B, half_t* __restrict__ C,
            float* __restrict__ W, int M_, int N_, int K_, int lda_, int ldb_, int ldc_) {
  MMA_PROBLEM_SIZE;
  extern __shared__ __align__(128) unsigned char smem[];
  half_t* sA = reinterpret_cast<half_t*>(smem);
  half_t* sB = sA + STAGES * A_STAGE;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm0 = (warp / WARPS_N) * WM, wn0 = (warp % WARPS_N) * WN;
  const int G = gridDim.x, g = blockIdx.x;
  float* slots = W;                                                           // G x BM * BN fp32
  unsigned int* flags = reinterpret_cast<unsigned int*>(W + (long long)G * BM * BN);  // G flags

  const int tm = (M + BM - 1) / BM, tiles = tm * ((N + BN - 1) / BN), iters = (K + BK - 1) / BK;
  int dp_tiles, sk_tiles;
  streamk_split(tiles, G, dp_tiles, sk_tiles);

  const bool vecA = mma_vec_a(A, K, lda), vecB = mma_vec_b(B, N, K, ldb);
  // Tile t walks M first: consecutive tiles share one B panel (the weights), read once from HBM.
  MmaTile tile{A, B, M, N, K, lda, ldb, vecA, vecB, 0, 0, sA, sB, smem_u32(sA), smem_u32(sB), tid, lane, wm0, wn0};
  auto place = [&](int t) {
    tile.m0 = (t % tm) * BM;
    tile.n0 = (t / tm) * BN;
  };
  float acc[MI][NI][4];
  float* const flat = &acc[0][0][0];

  // One loop, one inlined mainloop: the stream-K range first (peers publish early, owners reach
  // their tiles last), then the data-parallel tiles g, g + G, ... (whole waves).
  const int S = sk_tiles * iters;
  int it = streamk_begin(g, S, G);
  const int end = streamk_begin(g + 1, S, G);
  int dp_next = g;
  for (;;) {
    int t0 = 0, k0 = 0, k1 = iters;  // the unit's first iteration in the range, its K tiles [k0, k1)
    bool streamed = it < end;
    if (streamed) {
      const int s = it / iters;  // stream-K tile index
      t0 = s * iters;
      k0 = it - t0;
      k1 = min(end - t0, iters);
      place(dp_tiles + s);
      it = t0 + k1;
    } else if (dp_next < dp_tiles) {
      place(dp_next);
      dp_next += G;
    } else {
      break;
    }
    mma_zero(acc);
    mma_pipe_drain();
    mma_mainloop(acc, tile, k0, k1 - k0);
    if (k0 > 0) {
      // A peer: the first segment of this CTA; slot g <- partial sums, then the flag.
      float* slot = slots + (long long)g * BM * BN;
#pragma unroll
      for (int e = 0; e < FRAG; e += 4)
        sk_store4(slot + (long long)e * THREADS + 4 * tid, flat[e], flat[e + 1], flat[e + 2], flat[e + 3]);
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        sk_publish(flags + g);
      }
      continue;
    }
    if (k1 < iters) {
      // The owner of a split tile: add each peer's slot, in CTA order, once its flag says it is complete.
      for (int p = g + 1; p < G && streamk_begin(p, S, G) < t0 + iters; ++p) {
        if (streamk_begin(p, S, G) == streamk_begin(p + 1, S, G)) continue;  // an empty range
        if (tid == 0)
          while (sk_peek(flags + p) != SK_READY) __nanosleep(64);
        __syncthreads();
        const float* slot = slots + (long long)p * BM * BN;
#pragma unroll
        for (int e = 0; e < FRAG; e += 4) {
          const float4 v = sk_load4(slot + (long long)e * THREADS + 4 * tid);
          flat[e] += v.x;
          flat[e + 1] += v.y;
          flat[e + 2] += v.z;
          flat[e + 3] += v.w;
        }
        __syncthreads();  // every thread has read slot p before its flag is cleared
        if (tid == 0) flags[p] = 0u;
      }
    }
    mma_store_direct(C, ldc, M, N, tile.m0, tile.n0, wm0, wn0, lane, acc);
  }
}
