// Prelude of the stream-K families (streamk over mma.sync, streamk90 over wgmma): the persistent
// tile scheduler and the fix-up's workspace primitives, independent of any mainloop. Needs the
// DP knob.
//   Work: T block tiles of I MAC-loop iterations (K blocks) each, on a grid of G persistent CTAs.
//   The first DP tiles are data-parallel (CTA g takes tiles g, g + G, ...: whole waves); the
//   other SK tiles form one range of S = SK * I iterations that the G CTAs share evenly: CTA g
//   takes iterations [g * S / G, (g + 1) * S / G), in order, one segment per tile it touches.
//   A CTA walks its stream-K segments first, then its data-parallel tiles (StreamkWalk::next).
//   DP = 0 streams every tile, DP = 1 keeps all full waves but one data-parallel, DP = 2 streams
//   only the remainder tiles. tests/test_template_streamk.py holds the Python model and compiles
//   the text between the schedule markers below for the host to compare (SK_FN made `inline`).
//   Roles: a segment that starts at its tile's first iteration belongs to the tile's owner; any
//   other segment is the first segment of a peer CTA (only a CTA's first segment can start inside
//   a tile), which stores its fp32 partial tile to its own workspace slot and publishes a flag.
//   The owner reaches the tile at the end of its range, waits for each peer's flag in CTA order
//   (StreamkWalk::next_peer), adds the slots (deterministic), writes C and clears the flags.
//   Peers publish before they wait for anything and a CTA waits only for higher-numbered CTAs,
//   so the waits cannot close a cycle while all G CTAs are resident. A flag counts only when it
//   holds SK_READY, a value no repeated-byte fill of the workspace produces, and the owner returns
//   it to 0: the workspace needs no zeroing. Workspace: G slots of one tile's fp32, then G flags.

#define SK_READY 0x9E3779B9u  // four distinct bytes: no repeated-byte fill of the workspace equals it
#ifndef SK_FN
#define SK_FN __device__ __forceinline__
#endif

// ---- schedule: begin
// The tiles before the stream-K range (whole waves of G) and the stream-K tiles after them.
SK_FN void streamk_split(int tiles, int G, int& dp_tiles, int& sk_tiles) {
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
// The first stream-K iteration of CTA g: floor(g * S / G), as g * (S / G) + g * (S % G) / G in 32-bit
// arithmetic (S < 2^31 and G * G < 2^31, template.toml): a 64-bit division would be a subroutine
// call, whose saved registers spill beside the accumulators in the owner's peer walk.
SK_FN int streamk_begin(int g, int S, int G) { return g * (S / G) + g * (S % G) / G; }

// CTA g's walk over its work units: (tile, K iterations [k0, k1)). Stream-K tiles are numbered
// after the data-parallel ones (tile = dp_tiles + stream-K index).
struct StreamkWalk {
  int G, g, iters, dp_tiles, S, it, end, dp_next;
  SK_FN StreamkWalk(int tiles, int iters_, int G_, int g_) : G(G_), g(g_), iters(iters_), dp_next(g_) {
    int sk_tiles;
    streamk_split(tiles, G, dp_tiles, sk_tiles);
    S = sk_tiles * iters;
    it = streamk_begin(g, S, G);
    end = streamk_begin(g + 1, S, G);
  }
  // The next unit; false when the CTA has none left.
  SK_FN bool next(int& tile, int& k0, int& k1) {
    if (it < end) {
      const int s = it / iters, t0 = s * iters;
      k0 = it - t0;
      k1 = end - t0 < iters ? end - t0 : iters;
      tile = dp_tiles + s;
      it = t0 + k1;
      return true;
    }
    if (dp_next < dp_tiles) {
      tile = dp_next;
      k0 = 0;
      k1 = iters;
      dp_next += G;
      return true;
    }
    return false;
  }
  // The owner of stream-K `tile` (a unit with k0 == 0 and k1 < iters): the first CTA after p
  // that holds a segment of the tile, or -1 when none is left. Peers begin inside the tile, in
  // CTA order; CTAs with empty ranges (G close to S) are skipped.
  SK_FN int next_peer(int p, int tile) const {
    const int tile_end = (tile - dp_tiles + 1) * iters;
    for (++p; p < G && streamk_begin(p, S, G) < tile_end; ++p)
      if (streamk_begin(p, S, G) != streamk_begin(p + 1, S, G)) return p;
    return -1;
  }
};
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
// After every thread's slot stores and a barrier: one thread fences and publishes (release, GPU scope).
__device__ __forceinline__ void sk_publish(unsigned int* flag) {
  __threadfence();
  asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flag), "r"(SK_READY) : "memory");
}
// One thread spins until the flag holds SK_READY (acquire, GPU scope); a barrier follows.
__device__ __forceinline__ void sk_wait(const unsigned int* flag) {
  unsigned int v;
  for (;;) {
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flag) : "memory");
    if (v == SK_READY) return;
    __nanosleep(64);
  }
}
