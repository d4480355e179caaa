// Prelude shared by the mma.sync families (sm80_mma, tiny, streamk, swab, swpipe): fp16 bit type,
// the m16n8k16 tensor core instruction with fp32 accumulators, fp32 -> fp16 conversions and the
// MMA_PROBLEM_SIZE prologue. The renderer prepends it to the template's source (templates may not
// #include our own headers).
typedef unsigned short half_t;   // fp16 bits
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ void mma16816(float* c, const u32* a, const u32* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
__device__ __forceinline__ half_t f2h(float x) {
  half_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x));
  return h;
}
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The problem size and leading dimensions inside a kernel taking (..., M_, N_, K_, lda_, ldb_, ldc_):
// the rendered constants of a specialised candidate (EVO_M, EVO_N, EVO_K: packed rows, so every
// bound folds), the launch arguments otherwise.
#ifdef EVO_M
#if defined(EVO_LAYOUT_TN)
#define MMA_PROBLEM_SIZE const int M = EVO_M, N = EVO_N, K = EVO_K, lda = EVO_K, ldb = EVO_K, ldc = EVO_N
#else
#define MMA_PROBLEM_SIZE const int M = EVO_M, N = EVO_N, K = EVO_K, lda = EVO_K, ldb = EVO_N, ldc = EVO_N
#endif
#else
#define MMA_PROBLEM_SIZE const int M = M_, N = N_, K = K_, lda = lda_, ldb = ldb_, ldc = ldc_
#endif
