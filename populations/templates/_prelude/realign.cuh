// Prelude of the realigning loads, shared by the decode families (gemv, swab, swpipe: through
// decode.cuh) and sm90_wgmma's RAGGED producer: a row of fp16 that does not start on 16 bytes (K % 8
// != 0, or a misaligned base) is read as the 16-byte blocks of the aligned grid below it, and
// logical chunk j (halves [8j, 8j + 8) of the row) is halves s..s+7 of grid blocks j and j + 1, s the
// halves of the first block before the row. These helpers do the arithmetic; where the blocks come
// from (registers and shuffles, or a raw shared-memory copy) is the caller's.
// No includes: the text travels with each candidate.

__device__ __forceinline__ unsigned int dec_shf_r(unsigned int lo, unsigned int hi, unsigned int sh) {
  unsigned int d;
  asm("shf.r.wrap.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(sh));
  return d;
}
// Halves s..s+7 of the 16 halves (lo, hi), s in 0..7 (each thread its own): a three-step barrel
// shift (one half, one word, two words), about 16 instructions and no local memory.
__device__ __forceinline__ uint4 dec_realign(uint4 lo, uint4 hi, int s) {
  const unsigned int w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
  const unsigned int sh = (unsigned int)(s & 1) << 4;
  unsigned int v[7], u[6];
#pragma unroll
  for (int i = 0; i < 7; ++i) v[i] = dec_shf_r(w[i], w[i + 1], sh);
#pragma unroll
  for (int i = 0; i < 6; ++i) u[i] = (s & 2) ? v[i + 1] : v[i];
  return (s & 4) ? make_uint4(u[2], u[3], u[4], u[5]) : make_uint4(u[0], u[1], u[2], u[3]);
}
// Keep the first n halves of v (n < 8: the row's last, partial chunk).
__device__ __forceinline__ uint4 dec_keep(uint4 v, int n) {
  const unsigned int m0 = n >= 2 ? 0xffffffffu : (n == 1 ? 0xffffu : 0u);
  const unsigned int m1 = n >= 4 ? 0xffffffffu : (n == 3 ? 0xffffu : 0u);
  const unsigned int m2 = n >= 6 ? 0xffffffffu : (n == 5 ? 0xffffu : 0u);
  const unsigned int m3 = n >= 8 ? 0xffffffffu : (n == 7 ? 0xffffu : 0u);
  return make_uint4(v.x & m0, v.y & m1, v.z & m2, v.w & m3);
}
// The aligned grid below the row at p: its first 16-byte block and the halves of it before the row.
__device__ __forceinline__ void dec_grid(const unsigned short* p, const uint4*& base, int& s) {
  const unsigned long long a = (unsigned long long)p;
  base = reinterpret_cast<const uint4*>(a & ~15ull);
  s = (int)((a & 15ull) >> 1);
}
