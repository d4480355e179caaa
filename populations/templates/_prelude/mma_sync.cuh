// Prelude shared by the mma.sync families (sm80_mma, tiny): fp16 bit type, the m16n8k16 tensor
// core instruction with fp32 accumulators, and fp32 -> fp16 conversions. The renderer prepends
// it to the template's source (templates may not #include our own headers).
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
