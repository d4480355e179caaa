// evo template family B: Hopper HGEMM with TMA + wgmma, warp-specialised, multi-stage.
//
// C[M,N] = A[M,K] * B (fp16 in/out, fp32 accumulate). A is M x K row-major. B is N x K
// row-major (EVO_LAYOUT_TN, both operands K-major: the natural wgmma case) or K x N row-major
// (EVO_LAYOUT_NN: B is MN-major in shared memory and wgmma reads it with the transpose bit).
//
// Warpgroup 0 is the producer: one thread issues TMA loads of A (box BM x 64) and B (boxes of
// 64 x 64, BN/64 of them) into a STAGES-deep ring, signalling "full" mbarriers through
// complete_tx. Consumer warpgroups wait on "full", issue wgmma m64nBNk16 (4 per 64-wide K block
// per 64 rows) and release the stage through an "empty" mbarrier once the wgmmas reading it have
// retired (wait_group 1 keeps one K block in flight).
//   SCHED coop:     the CONSUMERS warpgroups split one BM x BN tile by rows.
//   SCHED pingpong: each consumer owns whole tiles (every CONSUMERS-th tile of the CTA), so one
//                   warpgroup's epilogue overlaps the other's main loop.
//   CLUSTER_M 2:    CTA pairs of a cluster compute vertically adjacent tiles that share a B
//                   panel; each CTA loads half of B's boxes and multicasts them to both, and
//                   consumers release a stage in both CTAs.
//   CLUSTER_N 2:    the same along N: the pair computes horizontally adjacent tiles that share an
//                   A panel, each CTA loading BM / 2 of its rows and multicasting them (with SWAP,
//                   the weights' tile: what a mid-M shape re-reads most from L2). CLUSTER_M or
//                   CLUSTER_N 4: the same over four CTAs (each loads a quarter of the shared panel,
//                   or its whole box in every fourth K block); a cluster is one-dimensional (one
//                   of CLUSTER_M, CLUSTER_N is 1). cuBLAS runs thin tiles with deep rings in such
//                   clusters on small mid rows (bench/RESULTS.md 27 (n), fourth run).
//   EPI direct:     fp32 registers -> fp16 global, guarded 4-byte stores.
//   EPI smem:       registers -> padded shared staging -> coalesced, guarded 16-byte stores.
//   BN % 64 != 0:   (TN, CLUSTER_M 1) a tile width fitted to a dimension (72, 104, ...): B comes in
//                   one box of BN rows and wgmma's N is BN (wgmma_n_any, _prelude/sm90_ptx.cuh).
//   SWAP 1:         (TN) the plan passes B's tensor map as tmA and A's as tmB and the kernel's M, N
//                   are the problem's N, M: it computes C^T tile by tile (the weights' N along wgmma's
//                   64-row side, the tokens' M along its N, a width fitted to M, as cuBLAS does for
//                   mid M) and the epilogue stores the accumulators transposed into C.
//   RAGGED 1:       (TN, no cluster) A and B are read in place, whatever their row pitch (K % 8 != 0,
//                   where no tensor map can describe them and RAGGED 0 needs the alignment
//                   transform's copies first): every producer warp copies (cp.async, 8 lanes a row) the
//                   aligned 16-byte grid blocks under its rows' next two K blocks into a raw ring (RSTAGES
//                   deep, 272 bytes a row: one group a thread for two ring stages), then shifts them into place
//                   (_prelude/realign.cuh) and stores them into the swizzled ring the consumers read,
//                   the halves past K and the rows past M or N zeroed. Nothing is copied outside the
//                   kernel: the weights stay where they are. RPRODUCERS 2 adds a second producer
//                   warpgroup (after the consumers) that shares the rows: the copy and the shift, not
//                   the loads' latency, bound the in-place kernel (RESULTS 27 (i)).
//   SPLIT_K > 1:    the work units are SPLIT_K x tiles: unit u computes tile u % tiles over
//                   the z = u / tiles share of the K blocks (balanced, none empty) and writes
//                   its fp32 partial tile to workspace[z][M][N] (direct stores); a second
//                   launch, evo_splitk_reduce (_prelude/splitk_reduce.cuh, prepended by the
//                   renderer), sums the slices in a fixed order into C. The
//                   first wave of a persistent grid then holds one z for many tiles (L2 reuse).
//                   With SWAP the partial C^T tile is stored transposed (store_partial_t), so the
//                   slices are C's M x N and the reduce is the unswapped one: cuBLAS's choice on few
//                   tiles with deep K at mid M (176x4608x19456: swapped 128 x 176, K split 3).
// TMA zero-fills out-of-bounds boxes, so ragged M, N, K need no padding; every store is
// guarded. Persistent mode: grid = min(#tiles, #SMs), each CTA loops over tiles (the kernel is
// the same; only the plan's grid differs). Tiles are ordered in groups of GROUP tile-rows
// (RASTER = M) or tile-columns (RASTER = N), like Triton's grouped order.
//
// Knobs (prepended by the renderer as #defines; template.toml documents them): BM, BN, BK,
// STAGES, CONSUMERS, SCHED, GROUP, RASTER, EPI, CLUSTER_M, CLUSTER_N, SPLIT_K. PERSISTENT only changes
// the grid.
// No CUTLASS/CuTe, no <cuda.h>, no includes at all: raw PTX (the wrappers, shared with streamk90,
// are _prelude/sm90_ptx.cuh, which the renderer puts before this file).

#ifndef BM
#define BM 128
#endif
#ifndef BN
#define BN 256
#define BN8 32
#endif
#ifndef SWAP
#define SWAP 0
#endif
#ifndef BK
#define BK 64
#endif
#ifndef STAGES
#define STAGES 4
#endif
#ifndef CONSUMERS
#define CONSUMERS 2
#endif
#ifndef GROUP
#define GROUP 8
#endif
#ifndef RASTER                 // string knobs: the renderer defines NAME_value aliases
#define RASTER_M 0
#define RASTER_N 1
#define RASTER RASTER_M
#endif
#ifndef SCHED
#define SCHED_coop 0
#define SCHED_pingpong 1
#define SCHED SCHED_coop
#endif
#ifndef EPI
#define EPI_direct 0
#define EPI_smem 1
#define EPI_tsmem 2
#define EPI EPI_direct
#endif
#ifndef CLUSTER_M
#define CLUSTER_M 1
#endif
#ifndef CLUSTER_N
#define CLUSTER_N 1
#endif
#ifndef SPLIT_K
#define SPLIT_K 1
#endif
#ifndef RAGGED
#define RAGGED 0
#endif
#ifndef RPRODUCERS
#define RPRODUCERS 1
#endif
#ifndef RSTAGES
#define RSTAGES 2
#endif
#if !defined(EVO_LAYOUT_TN) && !defined(EVO_LAYOUT_NN)
#define EVO_LAYOUT_TN 1
#endif

#if BK != 64
#error "BK must be 64 (one 128-byte swizzle row of fp16)"
#endif
#if CLUSTER_M != 1 && CLUSTER_M != 2 && CLUSTER_M != 4
#error "CLUSTER_M must be 1, 2 or 4"
#endif
#if CLUSTER_N != 1 && CLUSTER_N != 2 && CLUSTER_N != 4
#error "CLUSTER_N must be 1, 2 or 4"
#endif
#ifndef CLUSTER
#define CLUSTER (CLUSTER_M * CLUSTER_N)   // CTAs per cluster, ranks 0 .. CLUSTER - 1 along the grid's x
#endif
#if CLUSTER_M > 1 && CLUSTER_N > 1
#error "a cluster is one-dimensional: CLUSTER_M or CLUSTER_N, not both"
#endif
#if RAGGED && (CLUSTER > 1 || defined(EVO_LAYOUT_NN))
#error "RAGGED reads K-major rows (TN) into its own CTA's ring: no cluster, no NN"
#endif
#if RPRODUCERS != 1 && (RPRODUCERS != 2 || !RAGGED)
#error "RPRODUCERS 2 is RAGGED's second producer warpgroup (the TMA producer is one thread)"
#endif
// A's stage: one box of BM rows, or with CLUSTER_N 2 one slice of BM / 2 rows per CTA (a multiple
// of 32 rows: 4 KiB, whole swizzle atoms), multicast to both.
#define A_SLICE (BM / CLUSTER_N)
#if SPLIT_K > 1 && EPI != EPI_direct
#error "split-K partials are fp32 stores straight to the workspace: use EPI direct"
#endif
#define PINGPONG (SCHED == SCHED_pingpong)
#if PINGPONG && CONSUMERS != 2
#error "SCHED pingpong alternates two consumer warpgroups"
#endif
#if PINGPONG
#define WM BM                        // rows per consumer warpgroup (whole tiles)
#define TILE_STEP CONSUMERS          // a consumer takes every CONSUMERS-th tile of its CTA
#define EMPTY_ARRIVALS (CLUSTER)
#else
#define WM (BM / CONSUMERS)
#define TILE_STEP 1
#define EMPTY_ARRIVALS (CONSUMERS * CLUSTER)
#endif
#define WM_TILES (WM / 64)           // m64 wgmma slabs per consumer
#if WM % 64 != 0 || WM_TILES < 1
#error "each consumer warpgroup must own a multiple of 64 rows"
#endif
#if BN % 8 != 0 || BN < 8 || BN > 256
#error "BN must be a multiple of 8 in 8..256"
#endif
// B's stage: BN / 64 boxes of 64 rows (multicast: each CTA of the cluster loads every CLUSTER_M-th
// box), or, in TN (K-major B), one box of BN rows (B_ONE_BOX) or, with a cluster whose CTAs cannot
// share whole 64-row boxes, one slice of BN / CLUSTER_M rows per CTA (B_SPLIT). A slice starts a
// multiple of 8 rows (1024 B, one 128-byte swizzle atom) into the stage, so the shared-memory image
// is the one-box image. Where BN / CLUSTER_M is not a multiple of 8 (BN 72: a slice would start
// 4,608 B in, mid-atom) the CTAs take turns instead (B_ALT): in K block kb the CTA of rank
// kb % CLUSTER_M loads the whole BN-row box and multicasts it. cuBLAS's mid-M kernel is such a
// tile (swapped 128 x 72 in a 2 x 1 cluster); either way B leaves L2 once per cluster.
#define B_ALT (CLUSTER_M > 1 && BN % (64 * CLUSTER_M) != 0 && BN % (8 * CLUSTER_M) != 0)
#define B_SPLIT (CLUSTER_M > 1 && BN % (64 * CLUSTER_M) != 0 && !B_ALT)
#define B_ONE_BOX (CLUSTER_M == 1 && BN % 64 != 0)
#define B_SLICE (BN / CLUSTER_M)
#if (B_ONE_BOX || B_SPLIT || B_ALT) && defined(EVO_LAYOUT_NN)
#error "a BN that is not a multiple of 64 (or of 64 x CLUSTER_M with a cluster) needs TN (K-major B)"
#endif
#if SWAP && defined(EVO_LAYOUT_NN)
#error "SWAP needs TN"
#endif
#ifndef THREADS
#define THREADS (128 * (CONSUMERS + RPRODUCERS))
#endif
// RAGGED's producer threads: warpgroup 0, and with RPRODUCERS 2 the last one too (after the
// consumers, whose warpgroup numbers stay 1..CONSUMERS)
#define PRODUCER_THREADS (128 * RPRODUCERS)
#define A_STAGE_BYTES (BM * BK * 2)
#define B_STAGE_BYTES (BN * BK * 2)
#ifndef STAGE_BYTES
#define STAGE_BYTES (A_STAGE_BYTES + B_STAGE_BYTES)
#endif
#define ACC (BN / 2)                 // fp32 accumulators per thread per m64 slab
#define EPI_PITCH (BN * 2 + 16)      // bytes per staged row: +16 B keeps fragment writes conflict-free
// EPI tsmem (SWAP): the staged tile transposed, one C row of the tile (WM elements) per staged row
#define EPI_TPITCH (WM * 2 + 16)     // +16 B: the 8 rows of one stmatrix land in 8 distinct bank groups
#if EPI == EPI_tsmem && !SWAP
#error "EPI tsmem stages the swapped kernel's C^T tile transposed: it needs SWAP"
#endif
#if EPI == EPI_smem
#define EPI_STAGE_BYTES (CONSUMERS * WM * EPI_PITCH)
#elif EPI == EPI_tsmem
#define EPI_STAGE_BYTES (CONSUMERS * BN * EPI_TPITCH)
#else
#define EPI_STAGE_BYTES 0
#endif
// Register split after setmaxnreg: 128 x (PRODUCER_REGS + CONSUMER_REGS * CONSUMERS) must not exceed
// what the CTA was launched with, THREADS x the kernel's register count (__launch_bounds__(THREADS, 1):
// 168 for three warpgroups, 64,512 in all), or setmaxnreg.inc waits for registers no warp gives back
// and the kernel hangs (RAGGED's first split, 64 + 2 x 224 = 512 a row of 128 threads, hung on an
// H100; the TMA path's 40 + 2 x 232 = 504 is exactly 3 x 168). The ragged producer's 128 threads copy,
// shift and store: 72 registers beside two consumers of 216 (72 + 432 = 504: at 56 + 2 x 224 the warp-wide
// copies spilled a value at 128 + 96 rows; the in-place tiles' accumulators, at most 192 wide, fit 216),
// 96 beside one of 232. With RPRODUCERS 2 (one row a producer thread where the stage has 256 rows)
// four warpgroups are launched with 128 registers: 2 x 64 + 2 x 192 = 512 (56 spilled one value at
// 128 + 96 rows; the in-place tiles that fit the raw ring are at most 128 wide unswapped, 64
// accumulators); beside one consumer (three warpgroups of 168) 2 x 96 + 232 = 424.
#if RAGGED && RPRODUCERS == 2
#define CONSUMER_REGS (CONSUMERS == 2 ? 192 : 232)
#define PRODUCER_REGS (CONSUMERS == 2 ? 64 : 96)
#elif RAGGED
#define CONSUMER_REGS (CONSUMERS == 2 ? 216 : 232)
#define PRODUCER_REGS (CONSUMERS == 2 ? 72 : 96)
#else
#define CONSUMER_REGS 232
#define PRODUCER_REGS 40
#endif
// RAGGED: a raw stage holds, for each of the BM + BN rows of a ring stage, the 17 aligned 16-byte
// grid blocks that RAW_KB = 2 K blocks' 16 chunks of 16 bytes start and end in (16 where the row is
// aligned): one copy group feeds two ring stages, so the copies' overlapping blocks are fetched once.
#define RAW_ROWS (BM + BN)
#define RAW_KB 2
#define RAW_PITCH ((8 * RAW_KB + 1) * 16)
#if RAGGED
#define RAW_STAGE_BYTES (RAW_ROWS * RAW_PITCH)
#else
#define RAW_STAGE_BYTES 0
#endif
#define RAW_ROWS_PER_THREAD ((RAW_ROWS + PRODUCER_THREADS - 1) / PRODUCER_THREADS)

// ---------------------------------------------------------------- tile order
__device__ __forceinline__ void tile_coords(int t, int tiles_m, int tiles_n, int& tm, int& tn) {
#if RASTER == RASTER_N
  // groups of GROUP tile-columns; inside a group, walk down the columns' tiles n-fastest.
  int in_group = GROUP * tiles_m;
  int g = t / in_group, r = t - g * in_group;
  int first = g * GROUP;
  int size = tiles_n - first < GROUP ? tiles_n - first : GROUP;
  tn = first + r % size;
  tm = r / size;
#else
  int in_group = GROUP * tiles_n;
  int g = t / in_group, r = t - g * in_group;
  int first = g * GROUP;
  int size = tiles_m - first < GROUP ? tiles_m - first : GROUP;
  tm = first + r % size;
  tn = r / size;
#endif
}

// ---------------------------------------------------------------- epilogue
// One fragment pair of an fp32 partial tile into its workspace slice (8-byte stores when N is even).
__device__ __forceinline__ void store_partial(float* W, int M, int N, int row, int col, float x, float y) {
  if (row >= M || col >= N) return;
  float* p = W + (long long)row * N + col;
  if ((N & 1) == 0) {
    *reinterpret_cast<float2*>(p) = make_float2(x, y);
  } else {
    p[0] = x;
    if (col + 1 < N) p[1] = y;
  }
}

// SWAP with split-K: the pair (row, col), (row, col + 1) of the kernel's fp32 C^T partial tile goes to
// W[col][row], W[col + 1][row] (W is the kernel's N x M: rows of length M, C's own layout). Lanes
// hold 8 consecutive rows: each store instruction writes whole 32-byte sectors of four W rows.
__device__ __forceinline__ void store_partial_t(float* W, int M, int N, int row, int col, float x, float y) {
  if (row >= M || col >= N) return;
  W[(long long)col * M + row] = x;
  if (col + 1 < N) W[(long long)(col + 1) * M + row] = y;
}

// SWAP: the pair (row, col), (row, col + 1) of the kernel's C^T tile is C[col][row], C[col + 1][row]
// (C is the kernel's N x M: rows of length M).
__device__ __forceinline__ void store_pair_t(evo_half_bits* C, int M, int N, int row, int col, float x, float y) {
  if (row >= M || col >= N) return;
  const u32 h = pack_half2(x, y);
  C[(long long)col * M + row] = (evo_half_bits)(h & 0xFFFFu);
  if (col + 1 < N) C[(long long)(col + 1) * M + row] = (evo_half_bits)(h >> 16);
}

// ---------------------------------------------------------------- epilogue, ragged row pitch
// When C's row pitch is not a multiple of 8 elements (N % 8 != 0: C's rows start at 2-, 4- or
// 8-byte boundaries), 16-byte stores are misaligned. Writing 8 elements per thread one by one
// then scatters every warp-wide store over 32 chunks of 16 bytes (a partial write to 16-32 sectors
// per instruction, 8 instructions per 512 bytes: the L2 write traffic of a large C grows about
// eight-fold). These loops give each thread VW consecutive elements of one C row instead
// (VW = 4, 2 or 1: 8-, 4- or 2-byte stores, the widest the pitch keeps aligned) and consecutive
// threads the next VW elements of the same row, so every store instruction covers one
// contiguous run of 64-256 bytes.
__device__ __forceinline__ u32 ld_shared_b32(u32 addr) {
  u32 v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void ld_shared_b64(u32 addr, u32& a, u32& b) {
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "r"(addr) : "memory");
}

// A staged tile of ROWS x COLS elements (row r at stg + r * PITCH) into C (row pitch ldc, rows_ok x
// cols_ok valid) at (row0, col0): VW elements a thread (8, 4, 2 or 1: 16-, 8-, 4- or 2-byte
// stores), a row's runs on consecutive threads. VW divides ldc and cols_ok, so a run that starts
// inside is inside. The plain staging (WM x BN, C's rows) and the transposed one (EPI tsmem: BN x
// WM, C's rows of the swapped tile) both leave through it.
template <int VW, int ROWS, int COLS, int PITCH>
__device__ __forceinline__ void epi_runs(evo_half_bits* C, int ldc, int rows_ok, int cols_ok, u32 stg, int row0,
                                         int col0, int lt) {
#pragma unroll 4
  for (int v = lt; v < ROWS * (COLS / VW); v += 128) {
    const int r = v / (COLS / VW), col = (v % (COLS / VW)) * VW;
    const int grow = row0 + r, gcol = col0 + col;
    if (grow >= rows_ok || gcol >= cols_ok) continue;
    evo_half_bits* p = C + (long long)grow * ldc + gcol;
    const u32 a = stg + r * PITCH + col * 2;
    if (VW == 8) {
      u32 x0, x1, x2, x3;
      ld_shared_v4(a, x0, x1, x2, x3);
      asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(x0), "r"(x1), "r"(x2), "r"(x3) : "memory");
    } else if (VW == 4) {
      u32 x0, x1;
      ld_shared_b64(a, x0, x1);
      asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(x0), "r"(x1) : "memory");
    } else if (VW == 2) {
      *reinterpret_cast<u32*>(p) = ld_shared_b32(a);
    } else {
      *p = (evo_half_bits)ld_shared_u16(a);
    }
  }
}

// epi_runs with the widest run C's row pitch keeps aligned (16 bytes where ldc % 8 == 0).
template <int ROWS, int COLS, int PITCH>
__device__ __forceinline__ void epi_runs_aligned(evo_half_bits* C, int ldc, int rows_ok, int cols_ok, u32 stg,
                                                 int row0, int col0, int lt) {
  if ((ldc & 7) == 0) {
    epi_runs<8, ROWS, COLS, PITCH>(C, ldc, rows_ok, cols_ok, stg, row0, col0, lt);
  } else if ((ldc & 3) == 0) {
    epi_runs<4, ROWS, COLS, PITCH>(C, ldc, rows_ok, cols_ok, stg, row0, col0, lt);
  } else if ((ldc & 1) == 0) {
    epi_runs<2, ROWS, COLS, PITCH>(C, ldc, rows_ok, cols_ok, stg, row0, col0, lt);
  } else {
    epi_runs<1, ROWS, COLS, PITCH>(C, ldc, rows_ok, cols_ok, stg, row0, col0, lt);
  }
}

// SWAP: staged row r is C's column tile_row + r and staged column col is C's row tile_col + col
// (C's rows have length M, the kernel's M). A thread takes VW consecutive staged rows of one
// column (VW consecutive elements of one C row), consecutive threads the next VW, so a warp's
// store covers WM / VW threads' worth of one C row.
template <int VW>
__device__ __forceinline__ void epi_cols_ragged(evo_half_bits* C, int M, int N, u32 stg, int tile_row,
                                                int tile_col, int lt) {
#pragma unroll 2
  for (int v = lt; v < (WM / VW) * BN; v += 128) {
    const int col = v / (WM / VW), r = (v % (WM / VW)) * VW;
    const int crow = tile_col + col, ccol = tile_row + r;
    if (crow >= N || ccol >= M) continue;   // VW | M: the VW elements are all inside
    evo_half_bits* p = C + (long long)crow * M + ccol;
    u32 xs[VW];
#pragma unroll
    for (int e = 0; e < VW; ++e) xs[e] = ld_shared_u16(stg + (r + e) * EPI_PITCH + col * 2);
    if (VW == 4) {
      asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(xs[0] | (xs[1 % VW] << 16)),
                   "r"(xs[2 % VW] | (xs[3 % VW] << 16)) : "memory");
    } else if (VW == 2) {
      *reinterpret_cast<u32*>(p) = xs[0] | (xs[1 % VW] << 16);
    } else {
      *p = (evo_half_bits)xs[0];
    }
  }
}

// EPI tsmem: two 8 x 8 fp16 fragments (rows r..r+7 and r+8..r+15 of one 8-column group, in the
// mma C-fragment layout) stored transposed: lane L < 16 names the shared row that receives column
// L % 8 of fragment L / 8 (lanes 16-31 repeat those addresses, as stmatrix .x2 ignores them).
__device__ __forceinline__ void stmatrix_x2_trans(u32 addr, u32 top, u32 bottom) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};"
               :: "r"(addr), "r"(top), "r"(bottom) : "memory");
}

// Unit u of SPLIT_K x ctiles: its cluster tile and its K blocks [kb0, kb1). A balanced split
// (z * kblocks / SPLIT_K) leaves no unit empty while SPLIT_K <= kblocks (a constraint at the
// candidate's own shape; at smaller shapes some units are empty and write zero partials).
__device__ __forceinline__ void unit_range(int u, int ctiles, int kblocks, int& t, int& kb0, int& kb1) {
#if SPLIT_K > 1
  const int z = u / ctiles;
  t = u - z * ctiles;
  kb0 = (int)((long long)z * kblocks / SPLIT_K);
  kb1 = (int)((long long)(z + 1) * kblocks / SPLIT_K);
#else
  t = u;
  kb0 = 0;
  kb1 = kblocks;
#endif
}

// A consumer gives a ring slot back: to its own producer, and with multicast to every
// producer of the cluster (each one writes B boxes, or A slices, into this CTA's slot).
__device__ __forceinline__ void release_stage(u32 empty_bar) {
#if CLUSTER > 1
#pragma unroll
  for (u32 r = 0; r < CLUSTER; ++r) mbar_arrive_cluster(empty_bar, r);
#else
  mbar_arrive(empty_bar);
#endif
}

// ---------------------------------------------------------------- the ragged producer (RAGGED 1)
#if RAGGED
// Where the producer is in this CTA's sequence of K blocks: unit u (from `first` by `stride`), K
// block kb of [kb0, kb1), its tile's first rows of A (m0) and of B (n0). Units with no K block
// (split-K shares past kblocks at small instances) are skipped, as the consumers skip them.
struct RaggedCursor {
  int u, kb, kb0, kb1, m0, n0;
};
__device__ __forceinline__ void ragged_seek(RaggedCursor& c, int stride, int units, int ctiles, int kblocks,
                                            int ctiles_m, int ctiles_n) {
  for (; c.u < units; c.u += stride) {
    int t, kb0, kb1, tm, tn;
    unit_range(c.u, ctiles, kblocks, t, kb0, kb1);
    if (kb0 < kb1) {
      tile_coords(t, ctiles_m, ctiles_n, tm, tn);
      c.kb = c.kb0 = kb0;
      c.kb1 = kb1;
      c.m0 = tm * BM;
      c.n0 = tn * BN;
      return;
    }
  }
}
// Move on by `blocks` K blocks (one: the shift's cursor; the K blocks one raw stage holds: the copies').
__device__ __forceinline__ void ragged_next(RaggedCursor& c, int blocks, int stride, int units, int ctiles, int kblocks,
                                            int ctiles_m, int ctiles_n) {
  c.kb += blocks;
  if (c.kb >= c.kb1) {
    c.u += stride;
    ragged_seek(c, stride, units, ctiles, kblocks, ctiles_m, ctiles_n);
  }
}
// The K blocks of the raw stage that starts at c.kb (a unit's K blocks go two to a raw stage from kb0).
__device__ __forceinline__ int ragged_raw_blocks(const RaggedCursor& c) {
  return c.kb1 - c.kb < RAW_KB ? c.kb1 - c.kb : RAW_KB;
}
// This thread's place among the producer threads: warpgroup 0's are 0..127, the second producer
// warpgroup's (RPRODUCERS 2: the CTA's last, after the consumers) 128..255.
__device__ __forceinline__ int producer_thread() {
  return (int)threadIdx.x - (RPRODUCERS == 2 && threadIdx.x >= 128 ? 128 * CONSUMERS : 0);
}
// Issue this thread's share of its warp's copies of a raw stage's K blocks (ragged_raw_blocks). Warp w
// copies the rows its lanes shift (ragged_shift: rows 32w + PRODUCER_THREADS q + lane), eight lanes a row and four
// rows a cp.async, so one warp instruction reads about four 128-byte lines, not 32 (one row a lane
// read 32 rows' lines an instruction and left the producer L1-bound: RESULTS 27 (i)). A row's copies
// are the aligned 16-byte grid blocks of those K blocks that hold a half of the row (so no copy reaches
// past the matrix), lane % 8 taking blocks lane % 8, + 8, + 16. Then one commit group (empty where the
// thread has no copies or the unit none left), so that every raw stage is one group of every thread:
// before it shifts a raw stage each thread waits for its own oldest group (ldgsts_wait<RSTAGES - 1>)
// and the warp meets (__syncwarp) before any lane reads rows its neighbours copied.
__device__ __forceinline__ void ragged_issue(const RaggedCursor& c, u32 raw, const evo_half_bits* gA,
                                             const evo_half_bits* gB, int M, int N, int K) {
  const int g0 = c.kb * 8, want = 8 * ragged_raw_blocks(c);
#pragma unroll 1
  for (int q = 0; q < RAW_ROWS_PER_THREAD; ++q) {   // (rolled: the producer has 56-96 registers)
    // the warp's 32 rows of this pass lie in one operand (BM % 32 == 0): A's rows, then B's
    const int pth = producer_thread();
    int i = PRODUCER_THREADS * q + (pth & ~31) + ((pth & 31) >> 3);
    if (i >= RAW_ROWS) break;
    const bool in_a = i < BM;
    int row = in_a ? c.m0 + i : c.n0 + (i - BM);
    const int rows = in_a ? M : N;
    const evo_half_bits* p = (in_a ? gA : gB) + (long long)row * K;
#pragma unroll 1
    for (int r = 0; r < 8 && i < RAW_ROWS && row < rows; ++r, i += 4, row += 4, p += 4ll * K) {
      const uint4* grid;
      int s;
      dec_grid(p, grid, s);                         // the row's aligned grid and its shift on it
      const int blocks = (K + s + 7) / 8 - g0;      // grid blocks from g0 on holding a half of the row
      const int n = blocks < want + (s ? 1 : 0) ? blocks : want + (s ? 1 : 0);   // an aligned row ends in its own block
      const u32 dst = raw + (u32)(i * RAW_PITCH);
#pragma unroll 1
      for (int b = (int)(threadIdx.x & 7u); b < n; b += 8) ldgsts16(dst + 16u * (u32)b, grid + g0 + b);
    }
  }
  ldgsts_commit();
}
// Shift a landed raw stage into the ring stage's swizzled image (row r of a stage at r * 128 bytes,
// chunk j at (j ^ (r % 8)) * 16: what TMA's 128-byte swizzle writes and the wgmma descriptors read),
// zeros for the halves past K and the rows past M or N. `in_raw`: K block c.kb's place in its raw
// stage (its grid blocks start 128 bytes in for the second). Thread pt shifts rows pt, pt +
// PRODUCER_THREADS (its warp copied them: ragged_issue), all eight chunks of each: nine 16-byte reads of its raw row (each
// grid block read once; chunk j straddles blocks j and j + 1) and eight swizzled 16-byte stores. A
// warp's lanes are 32 consecutive rows, so 8 lanes' reads fall in 8 distinct bank groups (the pitch
// is 17 blocks) and so do their stores (the swizzle XORs the chunk with row % 8). No warp reads
// another's rows: a raw stage is refilled by each warp once its lanes have shifted their rows, so the
// only barrier on the raw ring is the warp's own (__syncwarp).
// The row's shift is dec_grid's from the matrix base's and the row's offset: (base halves past 16
// bytes + row * K) % 8, in 32-bit products (only the low three bits matter; the row's 64-bit
// pointer and dec_grid here spilled the producer, then of 56 registers, at 128 + 96 rows).
__device__ __forceinline__ void ragged_shift(const RaggedCursor& c, int in_raw, u32 raw, u32 sa, u32 sb,
                                             const evo_half_bits* gA, const evo_half_bits* gB, int M, int N, int K,
                                             int pt) {
  const u32 shift_a = (u32)(((unsigned long long)gA & 15ull) >> 1), shift_b = (u32)(((unsigned long long)gB & 15ull) >> 1);
  const int chunk0 = c.kb * 8;                       // the K block's first logical chunk (halves 8 chunk0 ...)
  const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int q = 0; q < RAW_ROWS_PER_THREAD; ++q) {
    const int i = pt + PRODUCER_THREADS * q;
    if (RAW_ROWS % PRODUCER_THREADS != 0 && i >= RAW_ROWS) break;   // (fewer rows than producer threads too)
    const bool in_a = i < BM;
    const int row = in_a ? c.m0 + i : c.n0 + (i - BM);
    const bool present = row < (in_a ? M : N);
    const int s = (int)(((in_a ? shift_a : shift_b) + (u32)row * (u32)K) & 7u);
    const u32 src = raw + (u32)(i * RAW_PITCH + in_raw * 128);
    const u32 dst = in_a ? sa + (u32)(i * 128) : sb + (u32)((i - BM) * 128);
    const u32 r8 = (u32)(i & 7);                     // BM % 8 == 0: B's row i - BM has the same
    if (present && K - 8 * chunk0 >= 64) {
      // The K block lies inside the row (every block but a row's last): no tail to cut, no zeros.
      // Grid blocks 0-4, then 5-8, each batch's reads issued together (the shared loads are
      // volatile and ordered: one at a time they paid their latency nine times a row), and
      // none of the general path's per-chunk checks (about 60 instructions a chunk there).
      uint4 w[5];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
#pragma unroll
        for (int t = h; t < 5; ++t) w[t] = ld_shared_u4(src + 16u * (u32)(4 * h + t));
#pragma unroll
        for (int t = 0; t < 4; ++t) st_shared_v4(dst + (((u32)(4 * h + t) ^ r8) << 4), dec_realign(w[t], w[t + 1], s));
        w[0] = w[4];
      }
      continue;
    }
    uint4 lo = present ? ld_shared_u4(src) : zero;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int halves = K - 8 * (chunk0 + j);       // of the row from this chunk on
      uint4 v = zero;
      if (present && halves > 0) {
        const uint4 hi = ld_shared_u4(src + 16u * (u32)(j + 1));
        v = dec_realign(lo, hi, s);
        if (halves < 8) v = dec_keep(v, halves);
        lo = hi;
      }
      st_shared_v4(dst + (((u32)j ^ r8) << 4), v);
    }
  }
}
#endif

// ---------------------------------------------------------------- the kernel
#if CLUSTER > 1
#define EVO_CLUSTER __cluster_dims__(CLUSTER, 1, 1)
#else
#define EVO_CLUSTER
#endif

// The whole kernel, for either entry below: the operands through tensor maps (tmA, tmB: the
// entry's __grid_constant__ parameters) or, RAGGED, through their pointers (gA, gB).
__device__ __forceinline__ void wgmma_gemm(const EvoTensorMap* tmA, const EvoTensorMap* tmB,
                                           const evo_half_bits* __restrict__ gA, const evo_half_bits* __restrict__ gB,
                                           evo_half_bits* __restrict__ C, float* __restrict__ W, int M, int N, int K) {
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // 128-byte swizzle atoms need 1024-byte alignment; the plan reserves 1 KiB of slack.
  const u32 base = (smem_u32(smem_raw) + 1023u) & ~1023u;
  const u32 sA = base;                                        // STAGES x BM x 128 B
  const u32 sB = base + STAGES * A_STAGE_BYTES;               // STAGES x BN x 128 B
  const u32 sEpi = base + STAGES * STAGE_BYTES;               // epilogue staging (EPI smem)
  const u32 sRaw = sEpi + EPI_STAGE_BYTES;                    // RAGGED: RSTAGES raw stages
  const u32 bars = sRaw + RSTAGES * RAW_STAGE_BYTES;          // full[STAGES], empty[STAGES]
#define FULL(s) (bars + 8u * (s))
#define EMPTY(s) (bars + 8u * (STAGES + (s)))

  const int tiles_m = (M + BM - 1) / BM;
  const int tiles_n = (N + BN - 1) / BN;
  // A cluster walks "cluster tiles": CLUSTER_M vertically or CLUSTER_N horizontally adjacent tiles.
  const int ctiles_m = (tiles_m + CLUSTER_M - 1) / CLUSTER_M;
  const int ctiles_n = (tiles_n + CLUSTER_N - 1) / CLUSTER_N;
  const int ctiles = ctiles_m * ctiles_n;
  const int units = ctiles * SPLIT_K;            // work units: (K share, cluster tile)
  const int first = blockIdx.x / CLUSTER, stride = gridDim.x / CLUSTER;
#if CLUSTER > 1
  const u32 rank = cluster_rank();
#else
  const u32 rank = 0;
#endif
  const int rank_m = CLUSTER_M > 1 ? (int)rank : 0, rank_n = CLUSTER_N > 1 ? (int)rank : 0;
  const int kblocks = (K + BK - 1) / BK;
  const int wg = threadIdx.x / 128;

  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; ++s) {
      mbar_init(FULL(s), RAGGED ? PRODUCER_THREADS : 1);   // RAGGED: every producer thread stores part of a stage
      mbar_init(EMPTY(s), EMPTY_ARRIVALS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#if !RAGGED
    tma_prefetch_desc(tmA);
    tma_prefetch_desc(tmB);
#endif
  }
#if CLUSTER > 1
  cluster_sync();   // peers' barriers are initialised before anyone multicasts or arrives remotely
#else
  __syncthreads();
#endif

  if (wg == 0 || wg > CONSUMERS) {   // (a warpgroup past the consumers: RAGGED's second producer)
    // ------------------------------------------------------------ producer
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" :: "n"(PRODUCER_REGS));
#if RAGGED
    // Two cursors over the same K blocks: `ahead` issues raw copies RSTAGES raw stages in advance,
    // `at` shifts the oldest landed one into the ring. Each warp copies, waits for and shifts its
    // own rows, so nothing but the ring's barriers is shared between warps; the ring's stores are fenced from the
    // async proxy (the wgmmas that read ring stages) both ways.
    const int pt = producer_thread();
    RaggedCursor ahead{first, 0, 0, 0, 0, 0}, at{first, 0, 0, 0, 0, 0};
    ragged_seek(ahead, stride, units, ctiles, kblocks, ctiles_m, ctiles_n);
    ragged_seek(at, stride, units, ctiles, kblocks, ctiles_m, ctiles_n);
    // The next raw stage's copies into raw stage r, or an empty group once the units run out: one
    // group a raw stage, always, so ldgsts_wait<RSTAGES - 1> is the oldest raw stage's.
    auto fill = [&](u32 r) {
      if (ahead.u < units) {
        ragged_issue(ahead, sRaw + r * RAW_STAGE_BYTES, gA, gB, M, N, K);
        ragged_next(ahead, ragged_raw_blocks(ahead), stride, units, ctiles, kblocks, ctiles_m, ctiles_n);
      } else {
        ldgsts_commit();
      }
    };
    for (u32 r = 0; r < RSTAGES; ++r) fill(r);
    u32 rt = 0;                                       // raw stages the shift has finished
    for (u32 it = 0; at.u < units; ++it) {
      const u32 rs = rt % RSTAGES, stage = it % STAGES;
      const int in_raw = (at.kb - at.kb0) % RAW_KB;   // this K block's place in its raw stage
      const bool raw_done = in_raw == RAW_KB - 1 || at.kb + 1 == at.kb1;
      ldgsts_wait<RSTAGES - 1>();                     // this thread's copies of raw stage rt have landed
      __syncwarp();                                   // and its warp's: a lane shifts rows eight lanes copied
      mbar_wait(EMPTY(stage), ((it / STAGES) & 1u) ^ 1u);
      fence_proxy_async_smem();
      ragged_shift(at, in_raw, sRaw + rs * RAW_STAGE_BYTES, sA + stage * A_STAGE_BYTES, sB + stage * B_STAGE_BYTES,
                   gA, gB, M, N, K, pt);
      fence_proxy_async_smem();                       // the ring stage's stores, for wgmma
      mbar_arrive(FULL(stage));
      if (raw_done) {
        __syncwarp();                                 // every lane has read its rows of the raw stage
        fill(rs);                                     // the warp's own rows of the raw stage, read above
        ++rt;
      }
      ragged_next(at, 1, stride, units, ctiles, kblocks, ctiles_m, ctiles_n);
    }
#else
    if (threadIdx.x == 0) {
      int stage = 0;
      u32 phase = 0;
      for (int u = first; u < units; u += stride) {
        int t, kb0, kb1, tm, tn;
        unit_range(u, ctiles, kblocks, t, kb0, kb1);
        tile_coords(t, ctiles_m, ctiles_n, tm, tn);
        const int m0 = (tm * CLUSTER_M + rank_m) * BM, n0 = (tn * CLUSTER_N + rank_n) * BN;
        for (int kb = kb0; kb < kb1; ++kb) {
          mbar_wait(EMPTY(stage), phase ^ 1u);
          const u32 full = FULL(stage);
          mbar_expect_tx(full, STAGE_BYTES);
#if CLUSTER_N > 1
          // this CTA's half of the shared A panel, multicast into the same place of both CTAs
          tma_load_2d_mc(sA + stage * A_STAGE_BYTES + rank * (A_SLICE * 128), tmA, full, kb * BK,
                         m0 + (int)rank * A_SLICE, (unsigned short)((1u << CLUSTER) - 1));
#else
          tma_load_2d(sA + stage * A_STAGE_BYTES, tmA, full, kb * BK, m0);
#endif
#if B_ONE_BOX
          // BN rows of 128 B in one box: the same shared-memory image as BN / 64 boxes of 64 rows
          tma_load_2d(sB + stage * B_STAGE_BYTES, tmB, full, kb * BK, n0);
#elif B_ALT
          // every CTA walks the same K blocks of the same cluster tiles: one of them loads B's whole
          // box and multicasts it; the others' full barriers count its bytes as their own slice's
          if (kb % CLUSTER_M == (int)rank)
            tma_load_2d_mc(sB + stage * B_STAGE_BYTES, tmB, full, kb * BK, n0, (unsigned short)((1u << CLUSTER_M) - 1));
#elif B_SPLIT
          // this CTA's slice of BN / CLUSTER_M rows, multicast into the same place of every CTA
          tma_load_2d_mc(sB + stage * B_STAGE_BYTES + rank * (B_SLICE * 128), tmB, full, kb * BK,
                         n0 + (int)rank * B_SLICE, (unsigned short)((1u << CLUSTER_M) - 1));
#else
#pragma unroll
          for (int j = 0; j < BN / 64; ++j) {
            const u32 dst = sB + stage * B_STAGE_BYTES + j * 8192;
#if defined(EVO_LAYOUT_NN)
            // B is K x N row-major: box of 64 k-rows x 64 n-columns, one 8 KiB chunk per 64 n.
            const int c0 = n0 + j * 64, c1 = kb * BK;
#else
            // B is N x K row-major: box of 64 n-rows x 64 k-columns.
            const int c0 = kb * BK, c1 = n0 + j * 64;
#endif
#if CLUSTER_M > 1
            if (j % CLUSTER_M == (int)rank) tma_load_2d_mc(dst, tmB, full, c0, c1, (unsigned short)((1u << CLUSTER_M) - 1));
#else
            tma_load_2d(dst, tmB, full, c0, c1);
#endif
          }
#endif
          if (++stage == STAGES) { stage = 0; phase ^= 1u; }
        }
      }
    }
#endif
  } else {
    // ------------------------------------------------------------ consumers
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" :: "n"(CONSUMER_REGS));
    const int c = wg - 1;
    const int lt = threadIdx.x - 128 * wg;   // thread in warpgroup
    const int warp = lt / 32, lane = lt % 32;
#if PINGPONG
    const int row_off = 0;                   // whole tiles; the unit loop interleaves consumers
#else
    const int row_off = c * WM;
#endif
    float acc[WM_TILES][ACC];
    // `it` is the position in the producer's sequence of K blocks (over all units of this
    // CTA): it gives the ring slot and its phase. `local` is the unit's index in this CTA.
    u32 it = 0;
    int local = 0;
    for (int u = first; u < units; u += stride, ++local) {
      int t, kb0, kb1, tm, tn;
      unit_range(u, ctiles, kblocks, t, kb0, kb1);
#if PINGPONG
      // pingpong: consumer c owns units c, c + CONSUMERS, ... of its CTA; skip the others' K blocks
      if (local % TILE_STEP != c) { it += (u32)(kb1 - kb0); continue; }
#endif
      tile_coords(t, ctiles_m, ctiles_n, tm, tn);
      const int m_tile = tm * CLUSTER_M + rank_m, n_tile = tn * CLUSTER_N + rank_n;
      int prev_stage = -1;
#if PINGPONG
      // Main loops run in tile order, one warpgroup at a time: wait for the previous tile's
      // warpgroup to have issued its main loop. Besides alternating the tensor cores, this keeps
      // every full-barrier wait within one phase of the barrier (parity cannot alias).
      if (local > 0) named_sync(3 + c, 128 * 2);
#endif
#if SPLIT_K > 1
      // An empty K share (more shares than K blocks: the evaluator also runs a generic candidate
      // at small ragged shapes) issues no wgmma; its partial tile must still be written, as zeros.
      if (kb0 == kb1) {
#pragma unroll
        for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
          for (int i = 0; i < ACC; ++i) acc[w][i] = 0.f;
        }
      }
#endif
      for (int kb = kb0; kb < kb1; ++kb, ++it) {
        const int stage = (int)(it % STAGES);
        mbar_wait(FULL(stage), (it / STAGES) & 1u);
        const u32 a_base = sA + stage * A_STAGE_BYTES + row_off * 128;
        const u32 b_base = sB + stage * B_STAGE_BYTES;
        wgmma_fence();
        wgmma_kblock<WM_TILES, BK / 16>(acc, a_base, b_base, kb > kb0);
        wgmma_commit();
        // Keep this K block's wgmmas in flight; the previous block's have retired, so its
        // stage can go back to the producer(s).
        wgmma_wait<1>();
        if (prev_stage >= 0 && lt == 0) release_stage(EMPTY(prev_stage));
        prev_stage = stage;
      }
#if PINGPONG
      // hand the tensor cores to the next tile's warpgroup (only if that tile exists)
      if (u + stride < units) named_arrive(3 + (c + 1) % CONSUMERS, 128 * 2);
#endif
      wgmma_wait<0>();
      if (prev_stage >= 0 && lt == 0) release_stage(EMPTY(prev_stage));
#pragma unroll
      for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
        for (int i = 0; i < ACC; ++i) fence_operand(acc[w][i]);
      }

      const int tile_row = m_tile * BM + row_off, tile_col = n_tile * BN;
#if EPI == EPI_tsmem
      // SWAP: fragments -> staging transposed by stmatrix (a staged row is one C row of the tile)
      // -> loads and stores along C's rows, 16 bytes a thread where M % 8 == 0
      const u32 stg = sEpi + c * BN * EPI_TPITCH;
      {
        const int half = (lane >> 3) & 1, rr = lane & 7;
#pragma unroll
        for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
          for (int j = 0; j < BN / 8; ++j) {
            const u32 addr = stg + (j * 8 + rr) * EPI_TPITCH + (w * 64 + warp * 16 + half * 8) * 2;
            stmatrix_x2_trans(addr, pack_half2(acc[w][4 * j + 0], acc[w][4 * j + 1]),
                              pack_half2(acc[w][4 * j + 2], acc[w][4 * j + 3]));
          }
        }
      }
      named_sync(1 + c, 128);
      epi_runs_aligned<BN, WM, EPI_TPITCH>(C, M, N, M, stg, tile_col, tile_row, lt);
      named_sync(1 + c, 128);   // staging is free again before this warpgroup's next tile
#elif EPI == EPI_smem
      // fragments -> padded staging (conflict-free 4-byte writes) -> 16-byte coalesced stores
      const u32 stg = sEpi + c * WM * EPI_PITCH;
#pragma unroll
      for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int r = w * 64 + warp * 16 + lane / 4, col = j * 8 + 2 * (lane % 4);
          st_shared_u32(stg + r * EPI_PITCH + col * 2, pack_half2(acc[w][4 * j + 0], acc[w][4 * j + 1]));
          st_shared_u32(stg + (r + 8) * EPI_PITCH + col * 2, pack_half2(acc[w][4 * j + 2], acc[w][4 * j + 3]));
        }
      }
      named_sync(1 + c, 128);
#if SWAP
      // C^T's tile: staged row r is column tile_row + r of C, staged column col is C's row
      // tile_col + col. A thread gathers 8 staged rows of one column (consecutive threads:
      // consecutive columns, so the 2-byte shared reads spread over the banks) and writes them as
      // 16 contiguous bytes of C's row.
      if ((M & 7) == 0) {
#pragma unroll 2
        for (int v = lt; v < (WM / 8) * BN; v += 128) {
          const int col = v % BN, r = (v / BN) * 8;
          const int crow = tile_col + col, ccol = tile_row + r;   // C's row and first column
          if (crow < N && ccol < M) {                              // M % 8 == 0: ccol + 8 <= M
            u32 xs[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const u32 lo = ld_shared_u16(stg + (r + 2 * e) * EPI_PITCH + col * 2);
              const u32 hi = ld_shared_u16(stg + (r + 2 * e + 1) * EPI_PITCH + col * 2);
              xs[e] = lo | (hi << 16);
            }
            evo_half_bits* p = C + (long long)crow * M + ccol;
            asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" :: "l"(p), "r"(xs[0]), "r"(xs[1]), "r"(xs[2]), "r"(xs[3]) : "memory");
          }
        }
      } else if ((M & 3) == 0) {
        epi_cols_ragged<4>(C, M, N, stg, tile_row, tile_col, lt);
      } else if ((M & 1) == 0) {
        epi_cols_ragged<2>(C, M, N, stg, tile_row, tile_col, lt);
      } else {
        epi_cols_ragged<1>(C, M, N, stg, tile_row, tile_col, lt);
      }
#else
      epi_runs_aligned<WM, BN, EPI_PITCH>(C, N, M, N, stg, tile_row, tile_col, lt);
#endif
      named_sync(1 + c, 128);   // staging is free again before this warpgroup's next tile
#else
      // epilogue: registers -> global, guarded (fragment layout of wgmma m64nN f32).
      const int row0 = tile_row + warp * 16 + lane / 4;
      const int col0 = tile_col + 2 * (lane % 4);
#if SPLIT_K > 1
      float* Wz = W + (long long)(u / ctiles) * M * N;   // this unit's K share's slice
#endif
#pragma unroll
      for (int w = 0; w < WM_TILES; ++w) {
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
          const int row = row0 + w * 64, col = col0 + j * 8;
#if SPLIT_K > 1 && SWAP
          store_partial_t(Wz, M, N, row, col, acc[w][4 * j + 0], acc[w][4 * j + 1]);
          store_partial_t(Wz, M, N, row + 8, col, acc[w][4 * j + 2], acc[w][4 * j + 3]);
#elif SPLIT_K > 1
          store_partial(Wz, M, N, row, col, acc[w][4 * j + 0], acc[w][4 * j + 1]);
          store_partial(Wz, M, N, row + 8, col, acc[w][4 * j + 2], acc[w][4 * j + 3]);
#elif SWAP
          store_pair_t(C, M, N, row, col, acc[w][4 * j + 0], acc[w][4 * j + 1]);
          store_pair_t(C, M, N, row + 8, col, acc[w][4 * j + 2], acc[w][4 * j + 3]);
#else
          store_pair(C, M, N, row, col, acc[w][4 * j + 0], acc[w][4 * j + 1]);
          store_pair(C, M, N, row + 8, col, acc[w][4 * j + 2], acc[w][4 * j + 3]);
#endif
        }
      }
#endif
    }
  }
#if CLUSTER > 1
  cluster_sync();   // no CTA leaves while its peer may still multicast into it or arrive on it
#endif
#undef FULL
#undef EMPTY
}

// Two entries, one compiled: the plan launches evo_wgmma with tensor maps, or (RAGGED) evo_wgmma_ragged
// with the operands' pointers; the unused operands are null.
#if RAGGED
extern "C" __global__ void __launch_bounds__(THREADS, 1)
evo_wgmma_ragged(const evo_half_bits* __restrict__ A, const evo_half_bits* __restrict__ B,
                 evo_half_bits* __restrict__ C, float* __restrict__ W, int M, int N, int K) {
  wgmma_gemm(nullptr, nullptr, A, B, C, W, M, N, K);
}
#else
extern "C" __global__ void __launch_bounds__(THREADS, 1) EVO_CLUSTER
evo_wgmma(const __grid_constant__ EvoTensorMap tmA, const __grid_constant__ EvoTensorMap tmB,
          evo_half_bits* __restrict__ C, float* __restrict__ W, int M, int N, int K) {
  wgmma_gemm(&tmA, &tmB, nullptr, nullptr, C, W, M, N, K);
}
#endif
