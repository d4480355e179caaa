// Prelude of the Hopper (sm_90a) families sm90_wgmma and streamk90: raw-PTX wrappers for
// mbarriers, TMA (plain and multicast), clusters, named barriers and wgmma (m64nNk16, fp16 in,
// fp32 accumulators, 128-byte-swizzled shared-memory descriptors), and the guarded fp16 pair
// store of the direct epilogue, and one K block of a ring stage's wgmmas (wgmma_kblock). Knob-free
// but for wgmma_bn, which dispatches on the BN knob (and wgmma_kblock, which calls it).
// No includes: the text travels with each candidate.

typedef unsigned short evo_half_bits;
typedef unsigned long long u64;
typedef unsigned int u32;

struct __align__(64) EvoTensorMap { unsigned long long opaque[16]; };

// ---------------------------------------------------------------- PTX helpers
__device__ __forceinline__ u32 smem_u32(const void* p) {
  u32 a;
  asm("{\n.reg .u64 t;\ncvta.to.shared.u64 t, %1;\ncvt.u32.u64 %0, t;\n}\n" : "=r"(a) : "l"(p));
  return a;
}
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" :: "r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" :: "r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
  u32 done;   // no clock-based watchdog: candidates may not read clocks; the evaluator's deadline ends hangs
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}
__device__ __forceinline__ void tma_load_2d(u32 dst, const EvoTensorMap* map, u32 bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];"
               :: "r"(dst), "l"((u64)map), "r"(c0), "r"(c1), "r"(bar) : "memory");
}
// One 16-byte cp.async (LDGSTS) from global `src` to shared `dst`, both 16-byte aligned, allocating in
// L1 (.ca), and the thread's commit and wait (N newest groups may stay in flight): sm90_wgmma's RAGGED
// producer copies the aligned grid blocks under its own rows, where no tensor map can describe a
// ragged row pitch. (A bulk copy a row was tried first: 256 small bulk copies a stage left the
// producer at a fifth of the staged kernels' speed on an H100.)
__device__ __forceinline__ void ldgsts16(u32 dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;" :: "r"(dst), "l"((u64)src) : "memory");
}
__device__ __forceinline__ void ldgsts_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void ldgsts_wait() { asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory"); }
// Orders this thread's generic-proxy accesses to shared memory before later async-proxy ones
// (wgmma reading what st.shared wrote; a bulk copy overwriting what ld.shared read).
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}
__device__ __forceinline__ void tma_prefetch_desc(const EvoTensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" :: "l"((u64)map) : "memory");
}
__device__ __forceinline__ void tma_load_2d_mc(u32 dst, const EvoTensorMap* map, u32 bar, int c0, int c1,
                                               unsigned short mask) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
               " [%0], [%1, {%2, %3}], [%4], %5;"
               :: "r"(dst), "l"((u64)map), "r"(c0), "r"(c1), "r"(bar), "h"(mask) : "memory");
}
__device__ __forceinline__ u32 cluster_rank() {
  u32 r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Arrive on the mbarrier at the same shared offset in CTA `rank` of the cluster. Default
// (release, CTA scope) semantics: a .release.cluster arrive costs a MEMBAR.ALL.GPU per call.
__device__ __forceinline__ void mbar_arrive_cluster(u32 bar, u32 rank) {
  asm volatile("{\n.reg .b32 r;\nmapa.shared::cluster.u32 r, %0, %1;\n"
               "mbarrier.arrive.shared::cluster.b64 _, [r];\n}\n"
               :: "r"(bar), "r"(rank) : "memory");
}
__device__ __forceinline__ void named_sync(u32 id, u32 count) {
  asm volatile("bar.sync %0, %1;" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void named_arrive(u32 id, u32 count) {
  asm volatile("bar.arrive %0, %1;" :: "r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
  asm volatile("st.shared.u32 [%0], %1;" :: "r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void ld_shared_v4(u32 addr, u32& a, u32& b, u32& c, u32& d) {
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(addr) : "memory");
}
__device__ __forceinline__ void st_shared_v4(u32 addr, uint4 v) {
  asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" :: "r"(addr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
}
__device__ __forceinline__ uint4 ld_shared_u4(u32 addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ u32 ld_shared_u16(u32 addr) {
  u32 v;
  asm volatile("ld.shared.u16 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" :: "n"(N) : "memory"); }
template <typename T>
__device__ __forceinline__ void fence_operand(T& r) { asm volatile("" : "+f"(r) :: "memory"); }

// Shared-memory matrix descriptor, 128-byte swizzle. Offsets in bytes.
__device__ __forceinline__ u64 make_desc(u32 saddr, u32 lbo, u32 sbo) {
  u64 d = 0;
  d |= (u64)((saddr & 0x3FFFF) >> 4);
  d |= (u64)((lbo & 0x3FFFF) >> 4) << 16;
  d |= (u64)((sbo & 0x3FFFF) >> 4) << 32;
  d |= 1ull << 62;
  return d;
}

// ---------------------------------------------------------------- wgmma m64nNk16 (generated)
template <int TB>
__device__ __forceinline__ void wgmma_n64(float (&d)[32], u64 da, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {"
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
    "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
    : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void wgmma_n128(float (&d)[64], u64 da, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
    "}, %64, %65, p, 1, 1, 0, %67;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
    : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void wgmma_n192(float (&d)[96], u64 da, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n192k16.f32.f16.f16 {"
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
    "}, %96, %97, p, 1, 1, 0, %99;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
    : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

template <int TB>
__device__ __forceinline__ void wgmma_n256(float (&d)[128], u64 da, u64 db, int scale_d) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 {"
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
    "}, %128, %129, p, 1, 1, 0, %131;\n}\n"
    : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
      "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
      "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
      "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
      "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
      "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
      "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
      "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
      "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
      "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
      "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
      "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
      "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
      "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
    : "l"(da), "l"(db), "r"(scale_d), "n"(TB));
}

// ---------------------------------------------------------------- wgmma m64nNk16, any N % 8 == 0 (TN)
// For tile widths other than 64/128/192/256 (BN fitted to a dimension: 72, 104, ...): one wrapper
// whose register list grows by one n8 column group (4 accumulators) per step of BN8 = BN / 8 (a
// derived knob): EVO_WS_k names group k's operands in the instruction, EVO_WB_k binds them, both
// empty past BN8 (conditional inclusion: the static scan refuses token pasting). The descriptors
// and the scale flag come first as read-write operands (%0-%2), so the accumulators' numbers (%3
// on) do not depend on N; B is K-major (no transpose: TN only).
#if defined(BN8) && BN % 64 != 0
#define EVO_WS_1 "%3, %4, %5, %6"
#define EVO_WB_1 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#if BN8 >= 2
#define EVO_WS_2 ", %7, %8, %9, %10"
#define EVO_WB_2 , "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
#else
#define EVO_WS_2
#define EVO_WB_2
#endif
#if BN8 >= 3
#define EVO_WS_3 ", %11, %12, %13, %14"
#define EVO_WB_3 , "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
#else
#define EVO_WS_3
#define EVO_WB_3
#endif
#if BN8 >= 4
#define EVO_WS_4 ", %15, %16, %17, %18"
#define EVO_WB_4 , "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#else
#define EVO_WS_4
#define EVO_WB_4
#endif
#if BN8 >= 5
#define EVO_WS_5 ", %19, %20, %21, %22"
#define EVO_WB_5 , "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19])
#else
#define EVO_WS_5
#define EVO_WB_5
#endif
#if BN8 >= 6
#define EVO_WS_6 ", %23, %24, %25, %26"
#define EVO_WB_6 , "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23])
#else
#define EVO_WS_6
#define EVO_WB_6
#endif
#if BN8 >= 7
#define EVO_WS_7 ", %27, %28, %29, %30"
#define EVO_WB_7 , "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
#else
#define EVO_WS_7
#define EVO_WB_7
#endif
#if BN8 >= 8
#define EVO_WS_8 ", %31, %32, %33, %34"
#define EVO_WB_8 , "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#else
#define EVO_WS_8
#define EVO_WB_8
#endif
#if BN8 >= 9
#define EVO_WS_9 ", %35, %36, %37, %38"
#define EVO_WB_9 , "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35])
#else
#define EVO_WS_9
#define EVO_WB_9
#endif
#if BN8 >= 10
#define EVO_WS_10 ", %39, %40, %41, %42"
#define EVO_WB_10 , "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39])
#else
#define EVO_WS_10
#define EVO_WB_10
#endif
#if BN8 >= 11
#define EVO_WS_11 ", %43, %44, %45, %46"
#define EVO_WB_11 , "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43])
#else
#define EVO_WS_11
#define EVO_WB_11
#endif
#if BN8 >= 12
#define EVO_WS_12 ", %47, %48, %49, %50"
#define EVO_WB_12 , "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#else
#define EVO_WS_12
#define EVO_WB_12
#endif
#if BN8 >= 13
#define EVO_WS_13 ", %51, %52, %53, %54"
#define EVO_WB_13 , "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51])
#else
#define EVO_WS_13
#define EVO_WB_13
#endif
#if BN8 >= 14
#define EVO_WS_14 ", %55, %56, %57, %58"
#define EVO_WB_14 , "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
#else
#define EVO_WS_14
#define EVO_WB_14
#endif
#if BN8 >= 15
#define EVO_WS_15 ", %59, %60, %61, %62"
#define EVO_WB_15 , "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59])
#else
#define EVO_WS_15
#define EVO_WB_15
#endif
#if BN8 >= 16
#define EVO_WS_16 ", %63, %64, %65, %66"
#define EVO_WB_16 , "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#else
#define EVO_WS_16
#define EVO_WB_16
#endif
#if BN8 >= 17
#define EVO_WS_17 ", %67, %68, %69, %70"
#define EVO_WB_17 , "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67])
#else
#define EVO_WS_17
#define EVO_WB_17
#endif
#if BN8 >= 18
#define EVO_WS_18 ", %71, %72, %73, %74"
#define EVO_WB_18 , "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71])
#else
#define EVO_WS_18
#define EVO_WB_18
#endif
#if BN8 >= 19
#define EVO_WS_19 ", %75, %76, %77, %78"
#define EVO_WB_19 , "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75])
#else
#define EVO_WS_19
#define EVO_WB_19
#endif
#if BN8 >= 20
#define EVO_WS_20 ", %79, %80, %81, %82"
#define EVO_WB_20 , "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79])
#else
#define EVO_WS_20
#define EVO_WB_20
#endif
#if BN8 >= 21
#define EVO_WS_21 ", %83, %84, %85, %86"
#define EVO_WB_21 , "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83])
#else
#define EVO_WS_21
#define EVO_WB_21
#endif
#if BN8 >= 22
#define EVO_WS_22 ", %87, %88, %89, %90"
#define EVO_WB_22 , "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87])
#else
#define EVO_WS_22
#define EVO_WB_22
#endif
#if BN8 >= 23
#define EVO_WS_23 ", %91, %92, %93, %94"
#define EVO_WB_23 , "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91])
#else
#define EVO_WS_23
#define EVO_WB_23
#endif
#if BN8 >= 24
#define EVO_WS_24 ", %95, %96, %97, %98"
#define EVO_WB_24 , "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#else
#define EVO_WS_24
#define EVO_WB_24
#endif
#if BN8 >= 25
#define EVO_WS_25 ", %99, %100, %101, %102"
#define EVO_WB_25 , "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99])
#else
#define EVO_WS_25
#define EVO_WB_25
#endif
#if BN8 >= 26
#define EVO_WS_26 ", %103, %104, %105, %106"
#define EVO_WB_26 , "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103])
#else
#define EVO_WS_26
#define EVO_WB_26
#endif
#if BN8 >= 27
#define EVO_WS_27 ", %107, %108, %109, %110"
#define EVO_WB_27 , "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107])
#else
#define EVO_WS_27
#define EVO_WB_27
#endif
#if BN8 >= 28
#define EVO_WS_28 ", %111, %112, %113, %114"
#define EVO_WB_28 , "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111])
#else
#define EVO_WS_28
#define EVO_WB_28
#endif
#if BN8 >= 29
#define EVO_WS_29 ", %115, %116, %117, %118"
#define EVO_WB_29 , "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115])
#else
#define EVO_WS_29
#define EVO_WB_29
#endif
#if BN8 >= 30
#define EVO_WS_30 ", %119, %120, %121, %122"
#define EVO_WB_30 , "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119])
#else
#define EVO_WS_30
#define EVO_WB_30
#endif
#if BN8 >= 31
#define EVO_WS_31 ", %123, %124, %125, %126"
#define EVO_WB_31 , "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123])
#else
#define EVO_WS_31
#define EVO_WB_31
#endif
#if BN8 >= 32
#define EVO_WS_32 ", %127, %128, %129, %130"
#define EVO_WB_32 , "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#else
#define EVO_WS_32
#define EVO_WB_32
#endif
#define EVO_STR2(x) #x
#define EVO_STR(x) EVO_STR2(x)
__device__ __forceinline__ void wgmma_n_any(float (&d)[BN / 2], u64 da, u64 db, int scale_d) {
  u32 s = (u32)scale_d;
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n"
    "wgmma.mma_async.sync.aligned.m64n" EVO_STR(BN) "k16.f32.f16.f16 {"
    EVO_WS_1 EVO_WS_2 EVO_WS_3 EVO_WS_4 EVO_WS_5 EVO_WS_6 EVO_WS_7 EVO_WS_8 EVO_WS_9 EVO_WS_10 EVO_WS_11 EVO_WS_12 EVO_WS_13 EVO_WS_14 EVO_WS_15 EVO_WS_16
    EVO_WS_17 EVO_WS_18 EVO_WS_19 EVO_WS_20 EVO_WS_21 EVO_WS_22 EVO_WS_23 EVO_WS_24 EVO_WS_25 EVO_WS_26 EVO_WS_27 EVO_WS_28 EVO_WS_29 EVO_WS_30 EVO_WS_31 EVO_WS_32
    "}, %0, %1, p, 1, 1, 0, 0;\n}\n"
    : "+l"(da), "+l"(db), "+r"(s), EVO_WB_1 EVO_WB_2 EVO_WB_3 EVO_WB_4 EVO_WB_5 EVO_WB_6 EVO_WB_7 EVO_WB_8 EVO_WB_9 EVO_WB_10 EVO_WB_11 EVO_WB_12
      EVO_WB_13 EVO_WB_14 EVO_WB_15 EVO_WB_16 EVO_WB_17 EVO_WB_18 EVO_WB_19 EVO_WB_20 EVO_WB_21 EVO_WB_22 EVO_WB_23 EVO_WB_24
      EVO_WB_25 EVO_WB_26 EVO_WB_27 EVO_WB_28 EVO_WB_29 EVO_WB_30 EVO_WB_31 EVO_WB_32);
}
#endif

template <int TB>
__device__ __forceinline__ void wgmma_bn(float (&d)[BN / 2], u64 da, u64 db, int scale_d) {
#if BN == 64
  wgmma_n64<TB>(d, da, db, scale_d);
#elif BN == 128
  wgmma_n128<TB>(d, da, db, scale_d);
#elif BN == 192
  wgmma_n192<TB>(d, da, db, scale_d);
#elif BN == 256
  wgmma_n256<TB>(d, da, db, scale_d);
#else
  static_assert(TB == 0, "a tile width other than 64/128/192/256 needs K-major B (TN)");
  wgmma_n_any(d, da, db, scale_d);
#endif
}

// One K block of a ring stage: KSTEPS k16 steps, each a wgmma per 64-row slab of A (WM slabs, 8 KiB
// apart at 128-byte rows) against B's BN columns. B's descriptor: K-major for TN; MN-major for NN
// (16 k-rows of 128 B per k16 step, 64-column chunks 8 KiB apart (LBO), 8-row groups 1 KiB apart
// (SBO), the transpose bit set; EVO_NN_DESC_SWAP reads LBO and SBO the other way round, for
// bench/wgmma_check.py). accumulate = false on a unit's first block: its first step overwrites acc.
template <int WM, int KSTEPS>
__device__ __forceinline__ void wgmma_kblock(float (&acc)[WM][BN / 2], u32 a_base, u32 b_base, bool accumulate) {
#pragma unroll
  for (int kk = 0; kk < KSTEPS; ++kk) {
#if defined(EVO_LAYOUT_NN)
#if defined(EVO_NN_DESC_SWAP)
    const u64 db = make_desc(b_base + kk * 2048, 1024, 8192);
#else
    const u64 db = make_desc(b_base + kk * 2048, 8192, 1024);
#endif
#else
    const u64 db = make_desc(b_base + kk * 32, 16, 1024);
#endif
#pragma unroll
    for (int w = 0; w < WM; ++w) {
      const u64 da = make_desc(a_base + w * 64 * 128 + kk * 32, 16, 1024);
#if defined(EVO_LAYOUT_NN)
      wgmma_bn<1>(acc[w], da, db, (accumulate || kk > 0) ? 1 : 0);
#else
      wgmma_bn<0>(acc[w], da, db, (accumulate || kk > 0) ? 1 : 0);
#endif
    }
  }
}

// ---------------------------------------------------------------- epilogue helpers
__device__ __forceinline__ u32 pack_half2(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));   // hi -> upper 16 bits
  return r;
}
__device__ __forceinline__ void store_pair(evo_half_bits* C, int M, int N, int row, int col, float x, float y) {
  if (row >= M || col >= N) return;
  const u32 h = pack_half2(x, y);
  evo_half_bits* p = C + (long long)row * N + col;
  if ((N & 1) == 0) {            // N even and col even: 4-byte aligned, col + 1 < N
    *reinterpret_cast<u32*>(p) = h;
  } else {
    p[0] = (evo_half_bits)(h & 0xFFFFu);
    if (col + 1 < N) p[1] = (evo_half_bits)(h >> 16);
  }
}
