// streamk90: persistent stream-K HGEMM over the Hopper TMA + wgmma mainloop (issue 26), for mid
// shapes (M 64-512 with large N * K) and shapes whose last wave of tiles would leave SMs idle.
// One launch of G = min(SMS, tiles x K blocks) CTAs, all resident (one per SM).
//
// Three separable pieces, as in CUTLASS's split of a GEMM kernel:
//   tile scheduler  StreamkWalk (_prelude/streamk_sched.cuh, shared with the mma.sync streamk
//                   family): each CTA's units, (tile, K blocks [k0, k1)), stream-K segments first
//                   and then its data-parallel tiles (DP); the roles owner / peer; next_peer.
//   mainloop        sm90_wgmma's, restricted to a unit's K blocks: warpgroup 0's thread 0 is the
//                   producer (TMA boxes of A: BM x 64, B: BN / 64 boxes of 64 x 64, into a
//                   STAGES-deep ring with full/empty mbarriers); CONSUMERS warpgroups split the
//                   tile by rows (coop) and issue wgmma m64nBNk16 (consume_unit). Producer and
//                   consumers walk the same unit sequence, so the ring's slot and phase follow a
//                   running count of K blocks, as in sm90_wgmma.
//   epilogue        by role (see streamk_sched.cuh): a peer stores its fp32 accumulators to its
//                   workspace slot in fragment order (each consumer thread 16-byte stores,
//                   coalesced across the warpgroups) and publishes its flag; the owner of a split
//                   tile waits for each peer's flag in CTA order and adds its slot into its
//                   registers; owners and data-parallel tiles write C (guarded fp16 pairs).
// Only the consumer warpgroups take part in the fix-up (named barrier 1); the producer runs
// ahead into the next unit meanwhile. TMA zero-fills out-of-bounds boxes (ragged M, N, K), so a
// partial K block adds zeros; every C store is guarded. Tile order: M fastest (consecutive tiles
// share one B panel, the weights, in L2).
// Knobs (#defines from template.toml): BM, BN, STAGES, CONSUMERS, DP; SMS only sizes the grid.
// Prelude: sm90_ptx.cuh (PTX wrappers, wgmma_bn, store_pair), streamk_sched.cuh.

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 128
#endif
#ifndef STAGES
#define STAGES 6
#endif
#ifndef CONSUMERS
#define CONSUMERS 2
#endif
#if !defined(EVO_LAYOUT_TN) && !defined(EVO_LAYOUT_NN)
#define EVO_LAYOUT_TN 1
#endif

#define BK 64                          // one 128-byte swizzle row of fp16 per K block
#define WM (BM / CONSUMERS)            // rows per consumer warpgroup
#define WM_TILES (WM / 64)             // m64 wgmma slabs per consumer
#if WM % 64 != 0 || WM_TILES < 1
#error "each consumer warpgroup must own a multiple of 64 rows"
#endif
#if BN % 64 != 0 && BN != 192
#error "BN must be 64, 128, 192 or 256"
#endif
#ifndef THREADS                        // template.toml derives it too
#define THREADS (128 * (CONSUMERS + 1))
#endif
#define CTHREADS (128 * CONSUMERS)     // consumer threads: the fix-up's named barrier
#define A_STAGE_BYTES (BM * BK * 2)
#define B_STAGE_BYTES (BN * BK * 2)
#define STAGE_BYTES (A_STAGE_BYTES + B_STAGE_BYTES)
#define ACC (BN / 2)                   // fp32 accumulators per thread per m64 slab
#define FRAG (WM_TILES * ACC)          // fp32 accumulators per consumer thread
#define CONSUMER_REGS 232              // 128 x (40 + 232 * CONSUMERS) <= 64 K registers
#define PRODUCER_REGS 40

__device__ __forceinline__ void consumers_sync() { named_sync(1, CTHREADS); }

// ---------------------------------------------------------------- mainloop: producer
// TMA loads of the unit's K blocks [k0, k1) of the tile at (m0, n0) into the ring.
__device__ __forceinline__ void produce_unit(const EvoTensorMap* tmA, const EvoTensorMap* tmB, u32 sA, u32 sB,
                                             u32 bars, int m0, int n0, int k0, int k1, int& stage, u32& phase) {
  for (int kb = k0; kb < k1; ++kb) {
    mbar_wait(bars + 8u * (STAGES + stage), phase ^ 1u);  // empty
    const u32 full = bars + 8u * stage;
    mbar_expect_tx(full, STAGE_BYTES);
    tma_load_2d(sA + stage * A_STAGE_BYTES, tmA, full, kb * BK, m0);
#pragma unroll
    for (int j = 0; j < BN / 64; ++j) {
#if defined(EVO_LAYOUT_NN)
      tma_load_2d(sB + stage * B_STAGE_BYTES + j * 8192, tmB, full, n0 + j * 64, kb * BK);  // 64 k x 64 n
#else
      tma_load_2d(sB + stage * B_STAGE_BYTES + j * 8192, tmB, full, kb * BK, n0 + j * 64);  // 64 n x 64 k
#endif
    }
    if (++stage == STAGES) {
      stage = 0;
      phase ^= 1u;
    }
  }
}

// ---------------------------------------------------------------- mainloop: consumers
// acc <- the sum over K blocks [k0, k1) (k1 > k0) of this warpgroup's rows of the tile. `it`
// counts the K blocks this CTA's consumers have taken over all units: ring slot and parity.
__device__ __forceinline__ void consume_unit(float (&acc)[WM_TILES][ACC], u32 sA, u32 sB, u32 bars, int row_off,
                                             int lt, int k0, int k1, u32& it) {
  int prev_stage = -1;
  for (int kb = k0; kb < k1; ++kb, ++it) {
    const int stage = (int)(it % STAGES);
    mbar_wait(bars + 8u * stage, (it / STAGES) & 1u);  // full
    const u32 a_base = sA + stage * A_STAGE_BYTES + row_off * 128;
    const u32 b_base = sB + stage * B_STAGE_BYTES;
    wgmma_fence();
    wgmma_kblock<WM_TILES, BK / 16>(acc, a_base, b_base, kb > k0);
    wgmma_commit();
    wgmma_wait<1>();  // the previous block's wgmmas have retired: its slot goes back
    if (prev_stage >= 0 && lt == 0) mbar_arrive(bars + 8u * (STAGES + prev_stage));
    prev_stage = stage;
  }
  wgmma_wait<0>();
  if (lt == 0) mbar_arrive(bars + 8u * (STAGES + prev_stage));
#pragma unroll
  for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
    for (int i = 0; i < ACC; ++i) fence_operand(acc[w][i]);
  }
}

// ---------------------------------------------------------------- epilogue
// Slot element of consumer thread ct's accumulators e..e+3 (e = w * ACC + i): [e * CTHREADS + 4 * ct],
// so a warp's 16-byte stores are contiguous. Owner and peers run the same code: same mapping.
__device__ __forceinline__ void store_slot(float* slot, const float (&acc)[WM_TILES][ACC], int ct) {
#pragma unroll
  for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
    for (int i = 0; i < ACC; i += 4)
      sk_store4(slot + (long long)(w * ACC + i) * CTHREADS + 4 * ct, acc[w][i], acc[w][i + 1], acc[w][i + 2], acc[w][i + 3]);
  }
}
__device__ __forceinline__ void add_slot(float (&acc)[WM_TILES][ACC], const float* slot, int ct) {
#pragma unroll
  for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
    for (int i = 0; i < ACC; i += 4) {
      const float4 v = sk_load4(slot + (long long)(w * ACC + i) * CTHREADS + 4 * ct);
      acc[w][i] += v.x;
      acc[w][i + 1] += v.y;
      acc[w][i + 2] += v.z;
      acc[w][i + 3] += v.w;
    }
  }
}
// Registers -> fp16 C, guarded (fragment layout of wgmma m64nN f32).
__device__ __forceinline__ void store_c(evo_half_bits* C, int M, int N, int tile_row, int tile_col, int lt,
                                        const float (&acc)[WM_TILES][ACC]) {
  const int warp = lt / 32, lane = lt % 32;
  const int row0 = tile_row + warp * 16 + lane / 4, col0 = tile_col + 2 * (lane % 4);
#pragma unroll
  for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      const int row = row0 + w * 64, col = col0 + j * 8;
      store_pair(C, M, N, row, col, acc[w][4 * j + 0], acc[w][4 * j + 1]);
      store_pair(C, M, N, row + 8, col, acc[w][4 * j + 2], acc[w][4 * j + 3]);
    }
  }
}

// ---------------------------------------------------------------- the kernel
extern "C" __global__ void __launch_bounds__(THREADS, 1)
evo_streamk90(const __grid_constant__ EvoTensorMap tmA, const __grid_constant__ EvoTensorMap tmB,
              evo_half_bits* __restrict__ C, float* __restrict__ W, int M, int N, int K) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // 128-byte swizzle atoms need 1024-byte alignment; the plan reserves 1 KiB of slack.
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sA = base;                              // STAGES x BM x 128 B
  const u32 sB = base + STAGES * A_STAGE_BYTES;     // STAGES x BN x 128 B
  const u32 bars = base + STAGES * STAGE_BYTES;     // full[STAGES], empty[STAGES]

  const int tiles_m = (M + BM - 1) / BM;
  const int tiles = tiles_m * ((N + BN - 1) / BN), iters = (K + BK - 1) / BK;
  const int G = gridDim.x, g = blockIdx.x;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(bars + 8u * s, 1);
      mbar_init(bars + 8u * (STAGES + s), CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    tma_prefetch_desc(&tmA);
    tma_prefetch_desc(&tmB);
  }
  __syncthreads();

  StreamkWalk walk(tiles, iters, G, g);
  int t, k0, k1;  // the unit: its tile and K blocks [k0, k1)
  if (wg == 0) {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(PRODUCER_REGS));
    if (threadIdx.x == 0) {
      int stage = 0;
      u32 phase = 0;
      while (walk.next(t, k0, k1))
        produce_unit(&tmA, &tmB, sA, sB, bars, (t % tiles_m) * BM, (t / tiles_m) * BN, k0, k1, stage, phase);
    }
    return;  // the producer warpgroup takes no part in the epilogue
  }

  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(CONSUMER_REGS));
  const int lt = threadIdx.x - 128 * wg;  // thread in its warpgroup
  const int ct = threadIdx.x - 128;       // thread among the consumers
  const int row_off = (wg - 1) * WM;
  float* const slots = W;                                                                  // G x BM * BN fp32
  unsigned int* const flags = reinterpret_cast<unsigned int*>(W + (long long)G * BM * BN);  // G flags
  float acc[WM_TILES][ACC];
  u32 it = 0;
  while (walk.next(t, k0, k1)) {
    consume_unit(acc, sA, sB, bars, row_off, lt, k0, k1, it);
    if (k0 > 0) {
      // A peer (this CTA's first unit): slot g <- the partial tile, then the flag.
      store_slot(slots + (long long)g * BM * BN, acc, ct);
      consumers_sync();
      if (ct == 0) sk_publish(flags + g);
      continue;
    }
    if (k1 < iters) {
      // The owner of a split tile: each peer's slot, in CTA order, once its flag is up.
      for (int p = walk.next_peer(g, t); p >= 0; p = walk.next_peer(p, t)) {
        if (ct == 0) sk_wait(flags + p);
        consumers_sync();
        add_slot(acc, slots + (long long)p * BM * BN, ct);
        if (ct == 0) flags[p] = 0u;  // read by no one else in this launch; the slot is not rewritten
      }
    }
    store_c(C, M, N, (t % tiles_m) * BM + row_off, (t / tiles_m) * BN, lt, acc);
  }
}
