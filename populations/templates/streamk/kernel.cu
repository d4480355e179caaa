// streamk: a persistent stream-K HGEMM over the mma.sync mainloop, for mid shapes (M 64-512 with
// large N * K) and any shape whose last wave of tiles would leave SMs idle. One launch.
//   Work: T = cdiv(M, BM) * cdiv(N, BN) block tiles of I = cdiv(K, BK) MAC-loop iterations each,
//   on G persistent CTAs (SMS * CPS, at most T * I). The schedule (data-parallel whole waves per
//   DP, the rest split evenly in iterations), the roles (owner, peer) and the fix-up's flags are
//   _prelude/streamk_sched.cuh's, shared with streamk90 (the same scheduler over wgmma).
//   Here a peer writes its fp32 accumulators to its slot in fragment order (coalesced); the
//   owner adds its peers' slots in CTA order, writes C and clears their flags. The CPS
//   constraints keep all G CTAs resident on SMS SMs, which the waits need.
// Knobs arrive as #defines (template.toml); prelude: mma_sync.cuh, mma_pipe.cuh (the shared
// multistage cp.async + ldmatrix + mma.sync mainloop, layout and direct epilogue of sm80_mma),
// streamk_sched.cuh.

#define FRAG (MI * NI * 4)    // fp32 accumulators per thread

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

  const bool vecA = mma_vec_a(A, K, lda), vecB = mma_vec_b(B, N, K, ldb);
  // Tile t walks M first: consecutive tiles share one B panel (the weights), read once from HBM.
  MmaTile tile{A, B, M, N, K, lda, ldb, vecA, vecB, 0, 0, sA, sB, smem_u32(sA), smem_u32(sB), tid, lane, wm0, wn0};
  float acc[MI][NI][4];
  float* const flat = &acc[0][0][0];

  // One loop, one inlined mainloop: the stream-K range first (peers publish early, owners reach
  // their tiles last), then the data-parallel tiles g, g + G, ... (whole waves).
  StreamkWalk walk(tiles, iters, G, g);
  int t, k0, k1;  // the unit: its tile and K tiles [k0, k1)
  while (walk.next(t, k0, k1)) {
    tile.m0 = (t % tm) * BM;
    tile.n0 = (t / tm) * BN;
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
      if (tid == 0) sk_publish(flags + g);
      continue;
    }
    if (k1 < iters) {
      // The owner of a split tile: add each peer's slot, in CTA order, once its flag says it is complete.
      for (int p = walk.next_peer(g, t); p >= 0; p = walk.next_peer(p, t)) {
        if (tid == 0) sk_wait(flags + p);
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
