// The alignment transform's pre-pass (populations/_plan.py, "staging"): copy an fp16 matrix of
// `rows` x `cols` (row pitch `cols`, so rows start at any 2-byte boundary when cols % 8 != 0) into
// a workspace buffer of row pitch `pitch` (a multiple of 8 elements, 16-byte aligned rows), the
// columns past `cols` zero-filled. The main kernel then reads the copy with TMA or 16-byte loads.
//
// Each thread writes one 16-byte vector of the copy. It reads the 8 source elements with two
// aligned 16-byte loads and a funnel shift (the source is one contiguous run of rows * cols
// elements), so the copy streams at close to HBM speed; the last vectors of the source and
// misaligned bases fall back to 2-byte loads, so nothing is read past the matrix.
// evo_stage copies one operand, evo_stage2 two in one launch (one launch less on small shapes).
// Compiled only where the candidate stages something (the STAGE knob of populations/_staging.py).
#if STAGE != STAGE_none

__device__ __forceinline__ unsigned int evo_stage_word(const unsigned int* w, int q, int odd, int i) {
  // word i of the shifted run: elements s + 2i, s + 2i + 1 with s = 2q + odd
  const unsigned int lo = w[q + i], hi = w[q + i + 1];
  return odd ? __funnelshift_r(lo, hi, 16) : lo;
}

template <int Q>
__device__ __forceinline__ uint4 evo_stage_shift(const unsigned int* w, int odd) {
  return make_uint4(evo_stage_word(w, Q, odd, 0), evo_stage_word(w, Q, odd, 1), evo_stage_word(w, Q, odd, 2),
                    evo_stage_word(w, Q, odd, 3));
}

// The 8 elements [e, e + 8) of the flat source (n elements), the ones at or past `valid` zero.
__device__ __forceinline__ uint4 evo_stage_load8(const unsigned short* __restrict__ src, long long e, int valid,
                                                 long long n, bool aligned) {
  uint4 out = make_uint4(0u, 0u, 0u, 0u);
  if (valid <= 0) return out;
  const long long a = e & ~7LL;
  const int s = (int)(e - a);
  if (valid >= 8 && aligned && (s == 0 ? a + 8 <= n : a + 16 <= n)) {
    const uint4* p = reinterpret_cast<const uint4*>(src + a);
    const uint4 v0 = __ldg(p);
    if (s == 0) return v0;
    const uint4 v1 = __ldg(p + 1);
    const unsigned int w[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    const int odd = s & 1;
    switch (s >> 1) {  // a constant word offset per case, so w stays in registers
      case 0: return evo_stage_shift<0>(w, odd);
      case 1: return evo_stage_shift<1>(w, odd);
      case 2: return evo_stage_shift<2>(w, odd);
      default: return evo_stage_shift<3>(w, odd);
    }
  }
  unsigned short h[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) h[j] = j < valid ? src[e + j] : (unsigned short)0;
  out.x = h[0] | ((unsigned int)h[1] << 16);
  out.y = h[2] | ((unsigned int)h[3] << 16);
  out.z = h[4] | ((unsigned int)h[5] << 16);
  out.w = h[6] | ((unsigned int)h[7] << 16);
  return out;
}

// Vector v (of rows * pitch / 8) of one operand's copy.
__device__ __forceinline__ void evo_stage_vector(const unsigned short* __restrict__ src, unsigned short* __restrict__ dst,
                                                 long long v, int cols, int pitch, long long n, bool aligned) {
  const int vpr = pitch >> 3;
  const long long r = v / vpr;
  const int c0 = (int)(v - r * vpr) * 8;
  const uint4 x = evo_stage_load8(src, r * cols + c0, cols - c0, n, aligned);
  *reinterpret_cast<uint4*>(dst + r * pitch + c0) = x;
}

extern "C" __global__ void __launch_bounds__(256)
evo_stage(const unsigned short* __restrict__ src, unsigned short* __restrict__ dst, int rows, int cols, int pitch) {
  const long long total = (long long)rows * (pitch >> 3), n = (long long)rows * cols;
  const bool aligned = ((unsigned long long)src & 15ull) == 0;
  for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < total; v += (long long)gridDim.x * blockDim.x)
    evo_stage_vector(src, dst, v, cols, pitch, n, aligned);
}

extern "C" __global__ void __launch_bounds__(256)
evo_stage2(const unsigned short* __restrict__ srcA, unsigned short* __restrict__ dstA, int rowsA, int colsA, int pitchA,
           const unsigned short* __restrict__ srcB, unsigned short* __restrict__ dstB, int rowsB, int colsB, int pitchB) {
  const long long totalA = (long long)rowsA * (pitchA >> 3), totalB = (long long)rowsB * (pitchB >> 3);
  const long long nA = (long long)rowsA * colsA, nB = (long long)rowsB * colsB;
  const bool alA = ((unsigned long long)srcA & 15ull) == 0, alB = ((unsigned long long)srcB & 15ull) == 0;
  for (long long v = blockIdx.x * (long long)blockDim.x + threadIdx.x; v < totalA + totalB; v += (long long)gridDim.x * blockDim.x) {
    if (v < totalA) evo_stage_vector(srcA, dstA, v, colsA, pitchA, nA, alA);
    else evo_stage_vector(srcB, dstB, v - totalA, colsB, pitchB, nB, alB);
  }
}
#endif  // STAGE != STAGE_none
