"""Static scan verdicts (evaluators.static._static): a table of sources that must pass or be refused."""
from __future__ import annotations

import pytest

from populations import Candidate, Launch, LaunchPlan, Shape, TensorMapSpec
from evaluators import ScanResult, scan, scan_source

KERNEL = r'''
#include <cuda_fp16.h>
extern "C" __global__ void evo_gemm(const __half* __restrict__ A, const __half* __restrict__ B,
                                    __half* C, int M, int N, int K) {
  int r = blockIdx.y * 16 + threadIdx.y, c = blockIdx.x * 16 + threadIdx.x;
  if (r >= M || c >= N) return;
  float acc = 0.f;
  for (int k = 0; k < K; ++k) acc += __half2float(A[r * K + k]) * __half2float(B[c * K + k]);
  C[r * N + c] = __float2half(acc);
}
'''
ARGS = ("A", "B", "C", "M", "N", "K")
SHAPE = Shape(128, 256, 64)


def plan(kernel: str = "evo_gemm", args: tuple[str, ...] = ARGS, grid=("cdiv(N, 16)", "cdiv(M, 16)", 1),
         block=(16, 16, 1), smem=0, tensor_maps=None) -> LaunchPlan:
    return LaunchPlan(launches=(Launch(kernel, grid, block, args, smem),), tensor_maps=tensor_maps or {})


def cand(source: str = KERNEL, p: LaunchPlan | None = None, generic: bool = False,
         shapes: tuple[Shape, ...] = (SHAPE,)) -> Candidate:
    return Candidate(source, p or plan(), shapes, generic=generic)


# Sources added in front of the good kernel: (id, extra source, substring of a reason or None if OK)
SOURCE_CASES = [
    ("good", "", None),
    ("comment_mentions_api", "// cudaMalloc(&p, 4); cublasGemmEx <<<1,1>>>\n/* __managed__ int x; */", None),
    ("string_mentions_api", 'static_assert(sizeof(int) == 4, "no cudaMalloc here");', None),
    ("device_macro", "#define DEV __device__ __forceinline__\nDEV float twice(float x) { return 2.f * x; }", None),
    ("constant_table", "__constant__ float tab[256];\n__device__ const float kOne = 1.f;\n"
                       "__device__ constexpr int kTwo = 2;\nstatic __device__ __forceinline__ int f() { return kTwo; }", None),
    ("namespace_template_struct",
     "namespace detail {\ntemplate <int N> __device__ __forceinline__ float g(float x) { return x * N; }\n"
     "struct Frag { float x[4]; static constexpr int n = 4; __device__ float sum() const { return x[0]; } };\n}", None),
    ("extern_shared_and_pipeline",
     "#include <cuda_pipeline.h>\n#include <mma.h>\n#include <cuda/std/cstdint>\n"
     "extern \"C\" __global__ void aux(int* p) { extern __shared__ char smem[]; float a[2][2] = {{0.f, 1.f}, {2.f, 3.f}};\n"
     "auto f = [&](int i) { return a[i][i]; }; p[0] = (int)f(1) + smem[0]; }", None),
    ("inline_ptx_and_unroll",
     "__device__ __forceinline__ void mma(float* d, const unsigned* a, const unsigned* b) {\n"
     "#pragma unroll\n for (int i = 0; i < 1; ++i)\n"
     ' asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"\n'
     ' : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1])); }', None),
    ("typedefs_and_names", "typedef struct { float x[4]; } Frag;\nstruct Acc { float v; };\n"
     "union U { float f; unsigned u; };\nenum class Mode : int { A = 1, B = 2 };\n"
     "__device__ int pick(int cuOffset) { int free_slots = cuOffset; return free_slots; }", None),
    ("struct_variable", "struct S { int a; } g_s;", "mutable namespace-scope variable g_s"),
    ("host_function", "void helper(int* p) { p[0] = 1; }", "host function helper"),
    ("host_qualifier", "__host__ __device__ float both(float x) { return x; }", "__host__"),
    ("main", "int main() { return 0; }", "main"),
    ("cuda_malloc", "__device__ void grab() { void* p; cudaMalloc(&p, 16); }", "CUDA runtime API cudaMalloc"),
    ("device_launch", "__device__ void dp() { void* b = cudaGetParameterBuffer(64, 64); cudaLaunchDevice(0, b, dim3(1), dim3(1), 0, 0); }",
     "cudaGetParameterBuffer"),
    ("driver_api", "__device__ void d() { cuLaunchKernel(0); }", "CUDA driver API call cuLaunchKernel"),
    ("triple_chevron", "__global__ void inner(int* p) {}\n__device__ void go(int* p) { inner<<<1, 1>>>(p); }", "<<<"),
    ("cublas", "__device__ void g() { cublasHgemm(0); }", "library call cublasHgemm"),
    ("host_header", "#include <cstdio>", "#include <cstdio> is not allowed"),
    ("runtime_header", '#include "cuda_runtime.h"', "not allowed"),
    ("macro_include", "#define H <cstdio>\n#include H", "not allowed"),
    ("mutable_device_global", "__device__ int g_calls;", "mutable namespace-scope variable g_calls"),
    ("mutable_device_array_init", "__device__ float g_cache[16] = {0};", "mutable namespace-scope variable g_cache"),
    ("plain_global", "int counter = 0;", "mutable namespace-scope variable counter"),
    ("pointer_to_const_is_mutable", "__device__ const int* g_ptr;", "mutable namespace-scope variable g_ptr"),
    ("managed", "__managed__ int shared_with_host;", "__managed__"),
    ("static_local", "__device__ int tick() { static int n = 0; return ++n; }", "mutable static local variable n"),
    ("static_member", "struct S { static int n; };\n__device__ int S::n;", "mutable"),
    ("extern_device_var", "extern __device__ int elsewhere;", "extern variable"),
    ("token_pasting", "#define CAT(a, b) a##b\n__device__ void f() { void* p; CAT(cuda, Malloc)(&p, 4); }", "token pasting"),
    ("macro_defines_host_fn", "#define DEF(n) void n(int* p) { p[0] = 0; }\nDEF(hidden)", "host function hidden"),
    ("macro_declares_global", "#define DECL(t, n) __device__ t n;\nDECL(int, counter)",
     "mutable namespace-scope variable counter"),
    ("variadic_macro_declares_global", "#define G(...) __VA_ARGS__ = 0;\nG(int hidden_state)",
     "mutable namespace-scope variable hidden_state"),
    ("function_macros_ok", "#define CDIV(a, b) (((a) + (b) - 1) / (b))\n#define KERNEL_FN(name) __device__ int name(int x) { return CDIV(x, 16); }\n"
     "KERNEL_FN(tiles)\n#define LDS(r, p) asm volatile(\"ld.shared.u32 %0, [%1];\" : \"=r\"(r) : \"r\"(p))\n"
     "#define STR(x) #x\n__device__ void g(unsigned p) { unsigned r; LDS(r, p); do { r += CDIV(r, 2); } while (0); static_assert(sizeof(STR(a)) == 2, \"\"); }", None),
    ("printf", "__device__ void say() { printf(\"hi\"); }", "printf"),
    ("malloc", "__device__ void* grab() { return malloc(64); }", "malloc"),
    ("new", "__device__ int* grab() { return new int[4]; }", "new"),
    ("ptx_call", '__device__ void c() { asm volatile("call.uni vprintf, (%0, %1);" :: "l"(0), "l"(0)); }', "call"),
    ("ptx_global_decl", '__device__ void c() { asm volatile(".global .u32 hidden_state;"); }', "device global declared in inline PTX"),
    ("pragma_other", "#pragma GCC optimize(\"O0\")", "#pragma GCC is not allowed"),
    ("_pragma_other", '_Pragma("GCC optimize") __device__ void f() {}', "_Pragma"),
    ("directive_other", "#include_next <cuda_fp16.h>", "directive #include_next"),
]


@pytest.mark.parametrize("name,extra,reason", SOURCE_CASES, ids=[c[0] for c in SOURCE_CASES])
def test_source_verdicts(name: str, extra: str, reason: str | None) -> None:
    _assert_verdict(name, scan(cand(extra + "\n" + KERNEL)), reason)


def _assert_verdict(name: str, result: ScanResult, reason: str | None) -> None:
    """Accepted when ``reason`` is None, else refused with a reason containing ``reason``."""
    if reason is None:
        assert result.ok, result.reasons
    else:
        assert not result.ok, f"{name} was accepted"
        assert any(reason in r for r in result.reasons), result.reasons


def test_size_limit() -> None:
    big = KERNEL + "\n" + ("// padding padding padding padding padding padding padding\n" * 5000)
    result = scan(cand(big))
    assert not result.ok and "bytes (limit" in result.reasons[0]


def test_telemetry() -> None:
    src = KERNEL + r'''
__device__ unsigned w() { unsigned s; asm volatile("mov.u32 %0, %%smid;" : "=r"(s)); return s; }
__device__ void w2() { asm volatile("wgmma.fence.sync.aligned;"); asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {};"); }
'''
    t = scan_source(src).telemetry
    assert t["reads_smid"] and t["mma_sync"] and t["sm90_features"] == ["wgmma"]
    assert t["kernels"] == ["evo_gemm"] and t["device_functions"] == 2 and t["asm_statements"] == 3
    assert scan_source(src).ok  # reading the SM id is telemetry, not a rejection


@pytest.mark.parametrize("snippet", [
    'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));',
    'asm volatile("mov.u64 %0, %%clock64;" : "=l"(t));',
    "t = clock64();",
    "t = clock();",
])
def test_clock_reads_are_rejected(snippet: str) -> None:
    src = KERNEL + "__device__ unsigned long long now() { unsigned long long t; " + snippet + " return t; }\n"
    result = scan_source(src)
    assert not result.ok and any("reads a clock" in r for r in result.reasons), result.reasons
    assert result.telemetry["reads_clock"]


TMAP_KERNEL = r'''
struct alignas(64) Tmap { unsigned char bytes[128]; };
extern "C" __global__ void evo_tma(const __grid_constant__ Tmap tmA, const Tmap tmB, __half* C, int M, int N, int K) {}
''' + KERNEL

PLAN_CASES = [
    ("good", cand(), None),
    ("missing_kernel", cand(p=plan(kernel="evo_gemm2")), "kernel evo_gemm2 is not an extern \"C\" __global__"),
    ("mangled_kernel", cand(KERNEL.replace('extern "C" ', ""), p=plan()), "is not extern \"C\""),
    ("extern_c_block", cand(KERNEL.replace('extern "C" __global__', 'extern "C" { __global__') + "}"), None),
    ("too_few_args", cand(p=plan(args=ARGS[:5])), "takes 6 parameters, the plan passes 5"),
    ("too_many_args", cand(p=plan(args=ARGS + ("lda",))), "takes 6 parameters, the plan passes 7"),
    ("int_to_pointer", cand(p=plan(args=("M", "B", "C", "A", "N", "K"))), "argument 0 (M) of evo_gemm needs a 32-bit integer"),
    ("pointer_to_int", cand(p=plan(args=("A", "B", "C", "workspace", "N", "K"))), "argument 3 (workspace)"),
    ("absurd_grid", cand(p=plan(grid=("cdiv(N, 16)", "M * 1000", 1))), "grid"),
    ("absurd_smem", cand(p=plan(smem="M * 4096")), "dynamic shared memory"),
    ("generic_breaks_at_smoke_shape", cand(p=plan(smem="49152 if M > 16 else -1"), generic=True), "at 1x1x1"),
    ("specialised_ok_at_its_shape", cand(p=plan(smem="49152 if M > 16 else -1")), None),
    ("tmap_without_grid_constant", cand(TMAP_KERNEL, p=plan("evo_tma", ("tmap:a", "tmap:a", "C", "M", "N", "K"),
                                         tensor_maps={"a": TensorMapSpec("A", (64, 64))})), "argument 1 (tmap:a)"),
    ("tmap_to_pointer", cand(TMAP_KERNEL, p=plan("evo_tma", ("tmap:a", "tmap:a", "tmap:a", "M", "N", "K"),
                                                 tensor_maps={"a": TensorMapSpec("A", (64, 64))})), "argument 2 (tmap:a)"),
    ("wide_int_param", cand(KERNEL.replace("int M,", "long M,")), "argument 3 (M) of evo_gemm needs a 32-bit integer"),
]


@pytest.mark.parametrize("name,candidate,reason", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_plan_verdicts(name: str, candidate: Candidate, reason: str | None) -> None:
    _assert_verdict(name, scan(candidate), reason)


def test_tmap_good_kernel_passes() -> None:
    src = TMAP_KERNEL.replace("const Tmap tmB", "const __grid_constant__ Tmap tmB")
    c = cand(src, p=plan("evo_tma", ("tmap:a", "tmap:b", "C", "M", "N", "K"),
                         tensor_maps={"a": TensorMapSpec("A", (64, 64)), "b": TensorMapSpec("B", (64, 64))}))
    assert scan(c).ok, scan(c).reasons


def test_smem_limit_depends_on_arch() -> None:
    c = cand(p=plan(smem=200 * 1024))
    assert scan(c, arch="sm_90a").ok
    result = scan(c, arch="sm_80")
    assert not result.ok and "166912" in result.reasons[0]


def test_hostile_corpus_static_cases() -> None:
    """The red-team kernels that break the ABI in source are refused by the scan alone."""
    import hostile_corpus as hc

    expected_refused = {"calls_cublas", "device_side_launch", "global_call_counter", "host_private_stream",
                        "host_thread", "l2_persist_window", "static_cache_global", "globaltimer_skip_when_hot",
                        "compile_bomb_unroll", "unterminated_string_lexer", "unterminated_raw_string",
                        "macro_substitution_bomb"}
    present = {p.stem for p in hc.CORPUS_DIR.glob("*.cu")}
    if not expected_refused <= present:
        pytest.skip("hostile corpus not present")
    for name in sorted(present):
        ok = scan_source(hc.render_source(hc.CORPUS_DIR / f"{name}.cu")).ok
        assert ok == (name not in expected_refused), name


def test_macro_bomb_is_cut_short() -> None:
    """Expansion is bounded by a work budget: a bomb is refused, and the scan stays well under a second."""
    import time

    ladder = "#define A0 x x x x x x x x x x\n" + "".join(
        f"#define A{i} " + " ".join([f"A{i - 1}"] * 10) + "\n" for i in range(1, 9))
    t0 = time.perf_counter()
    result = scan_source(ladder + "__device__ void f() { A8; }\n" + KERNEL)
    assert time.perf_counter() - t0 < 5
    assert not result.ok and result.telemetry["macro_expansion_truncated"]
    assert any("macro expansion exceeds" in r for r in result.reasons), result.reasons
