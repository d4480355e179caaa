"""The C++/CUDA source of an export: per candidate its translation unit (kernels renamed per shape,
its code in an anonymous namespace, an accessor per kernel), per shape its launcher (the resolved
launch plan as constants, TMA descriptors encoded per call), and the dispatchers. Text only: no
compiler runs here (``evo/export/_export.py`` builds and links what these functions write).
"""
from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from populations import Candidate, Shape, stage_grid

__all__ = ["PRELUDE", "dispatcher", "extern_c_kernels", "kernel_unit", "launcher", "prepared_b", "split_includes"]

SWIZZLE_ENUM = {0: "CU_TENSOR_MAP_SWIZZLE_NONE", 32: "CU_TENSOR_MAP_SWIZZLE_32B",
                64: "CU_TENSOR_MAP_SWIZZLE_64B", 128: "CU_TENSOR_MAP_SWIZZLE_128B"}


def _tmap_geometry(spec: Any, shape: Shape) -> tuple[tuple[int, int], int, tuple[int, int]]:
    """(globalDim innermost first, row pitch bytes, boxDim) as contracts.md §1 defines them."""
    from evaluators import tmap_geometry  # noqa: PLC0415 (evo may import evaluators)

    g = tmap_geometry(spec, shape)
    return g.global_dim, g.global_strides[0], g.box_dim


def prepared_b(cand: Candidate, shape: Shape) -> Any:
    """The staged copy of B at ``shape`` (a :class:`populations.StagedCopy`), or None: where the
    candidate's plan stages B, the export also writes a launcher that takes B already padded
    (``prepared`` in :func:`launcher`), so a caller whose B is static (``nn.Linear``'s weight)
    pads it once instead of every call."""
    return next((c for c in cand.plan.staged_copies(shape) if c.operand == "B"), None)


def _without_b_copy(launches: list[Any], kernels: list[str]) -> list[Any]:
    """``launches`` with the pre-pass copy of B taken out: ``evo_stage`` of B dropped, the fused
    ``evo_stage2`` (A then B) replaced by ``evo_stage`` of A alone (its grid as _staging sizes it)."""
    out = []
    for rl in launches:
        if "stagedB" not in rl.args or rl.kernel not in ("evo_stage", "evo_stage2"):
            out.append(rl)
        elif rl.kernel == "evo_stage2":
            if "evo_stage" not in kernels:
                raise ValueError("a prepared-B launcher needs evo_stage among the unit's kernels")
            a_args = rl.args[:5]  # A, stagedA, M, K, ldsa (populations/_staging.py _A_ARGS)
            out.append(replace(rl, kernel="evo_stage", args=a_args, grid=(stage_grid(a_args[2] * (a_args[4] // 8)), 1, 1)))
    return out


def launcher(shape: Shape, cand: Candidate, kernels: list[str], tag: str = "", symbol: str = "",
             prepared: bool = False) -> tuple[str, int]:
    """The C++ of the launcher ``symbol`` (default ``evo_hgemm_<key>``) for one shape, and its
    workspace bytes. ``tag`` (default the shape's key) names the unit's kernel accessors.

    ``prepared`` (only where :func:`prepared_b` is not None) writes the launcher for a B padded
    once by the caller: ``(A, B, ldb, C, M, N, K, workspace, stream)``, B's rows ``ldb`` elements
    apart (a multiple of 8, at least B's columns; what lies past the columns is never read: the
    tensor map's extent stops there), and no pre-pass copy of B."""
    launches, workspace = cand.plan.resolve(shape)
    key = tag or shape.key
    sfx = "_wb" if prepared else ""  # the launcher's own static state, apart from the plain launcher's
    symbol = symbol or f"evo_hgemm_{shape.key}{sfx}"
    lines = [f"// {shape}: candidate {cand.id} ({cand.template or 'free-form'})" + (", B prepared" if prepared else "")]
    for i, name in enumerate(kernels):
        lines.append(f'extern "C" const void* evo_{key}_kernel_{i}(void);')
    b_copy = prepared_b(cand, shape)
    if prepared and b_copy is None:
        raise ValueError(f"candidate {cand.id} does not stage B at {shape}: no prepared-B launcher")
    ldb = "long long ldb, " if prepared else ""
    lines += [f'extern "C" int {symbol}(const void* A, const void* B, {ldb}void* C, int M, int N, int K,',
              "                               void* workspace, cudaStream_t stream) {",
              f"  if (M != {shape.m} || N != {shape.n} || K != {shape.k}) return -2;"]
    if prepared:
        assert b_copy is not None
        lines.append(f"  if (ldb < {b_copy.cols} || ldb % 8) return -5;")
        launches = _without_b_copy(launches, kernels)
    if workspace:
        lines.append("  if (workspace == nullptr) return -3;")
        if cand.plan.zero_workspace:
            lines.append(f"  {{ cudaError_t e = cudaMemsetAsync(workspace, 0, {workspace}ull, stream); if (e) return (int)e; }}")
    pointers = {"A": "(void*)A", "B": "(void*)B", "C": "C", "workspace": "workspace"}
    for copy in cand.plan.staged_copies(shape):  # the alignment transform's copies, inside the workspace
        pointers[f"staged{copy.operand}"] = f"(void*)((char*)workspace + {copy.offset}ull)"
    if prepared:
        pointers["stagedB"] = "(void*)B"  # the caller's padded copy
    used_maps = sorted({a[1] for rl in launches for a in rl.args if isinstance(a, tuple)})
    for name in used_maps:
        spec = cand.plan.tensor_maps[name]
        (d0, d1), pitch, (b0, b1) = _tmap_geometry(spec, shape)
        row = "(cuuint64_t)ldb * 2ull" if prepared and spec.pointer == "stagedB" else f"{pitch}ull"
        lines.append(f"  alignas(64) CUtensorMap tm_{name};")
        lines.append(f"  {{ const cuuint64_t dim[2] = {{{d0}ull, {d1}ull}}; const cuuint64_t pitch[1] = {{{row}}};")
        lines.append(f"    const cuuint32_t box[2] = {{{b0}u, {b1}u}}; const cuuint32_t es[2] = {{1u, 1u}};")
        lines.append(f"    if (evo_encode(&tm_{name}, {pointers[spec.pointer]}, dim, pitch, box, es, {SWIZZLE_ENUM[spec.swizzle]})) return -4; }}")
    for j, rl in enumerate(launches):
        idx = kernels.index(rl.kernel)
        values, params = [], []
        for n, arg in enumerate(rl.args):
            if isinstance(arg, tuple):
                params.append(f"(void*)&tm_{arg[1]}")
            elif isinstance(arg, str):
                values.append(f"  void* p{j}_{n} = {pointers[arg]};")
                params.append(f"&p{j}_{n}")
            else:
                values.append(f"  int p{j}_{n} = {int(arg)};")
                params.append(f"&p{j}_{n}")
        lines += values
        lines.append(f"  void* args{j}[] = {{{', '.join(params) or 'nullptr'}}};")
        lines.append(f"  {{ const void* f = evo_{key}_kernel_{idx}();")
        if rl.smem > 48 * 1024:
            lines.append(f"    if (!evo_smem_ready(f, {rl.smem}, &evo_attr_{key}{sfx}_{j})) return (int)cudaErrorInvalidValue;")
            lines.insert(0, f"static unsigned long long evo_attr_{key}{sfx}_{j} = 0;")
        g, b = rl.grid, rl.block
        if cand.plan.coresident:  # a grid whose CTAs wait on each other: cuBLAS where it cannot be resident
            lines.append(f"    if (!evo_resident(f, {g[0] * g[1] * g[2]}ll, {b[0] * b[1] * b[2]}, {rl.smem}, "
                         f"evo_fit_{key}{sfx}_{j})) return -1;")
            lines.insert(0, f"static unsigned long long evo_fit_{key}{sfx}_{j}[2] = {{0, 0}};")
        lines.append(f"    cudaError_t e = cudaLaunchKernel(f, dim3({g[0]}, {g[1]}, {g[2]}), dim3({b[0]}, {b[1]}, {b[2]}), "
                     f"args{j}, {rl.smem}, stream); if (e) return (int)e; }}")
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines), workspace


PRELUDE = """// Generated by evo export. Do not edit.
#include <cuda.h>
#include <cuda_runtime.h>

typedef CUresult (*evo_encode_fn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
    const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// contracts.md section 1: fp16, 2-D over the matrix as stored, L2 promotion 128B, OOB fill zeros.
// Opt a kernel in to more than 48 KiB of dynamic shared memory, once per device (a bit per device).
static bool evo_smem_ready(const void* f, int bytes, unsigned long long* done) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) return false;
  if (*done >> dev & 1ull) return true;
  if (cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) return false;
  *done |= 1ull << dev;
  return true;
}

// Whether a grid of `ctas` CTAs can be resident at once on the current device (occupancy x SMs),
// as a persistent grid whose CTAs wait on each other needs; decided once per device: bit `dev`
// of state[0] says known, of state[1] says fits. A smaller GPU (fewer SMs, a MIG slice) gets -1
// from the launcher, and the caller runs cuBLAS instead of a grid that could wait forever.
static bool evo_resident(const void* f, long long ctas, int threads, int smem, unsigned long long* state) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) return false;
  if (state[0] >> dev & 1ull) return state[1] >> dev & 1ull;
  int sms = 0, per_sm = 0;
  bool fits = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess &&
              cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, f, threads, (size_t)smem) == cudaSuccess &&
              (long long)sms * per_sm >= ctas;
  state[0] |= 1ull << dev;
  if (fits) state[1] |= 1ull << dev;
  return fits;
}

static int evo_encode(CUtensorMap* map, void* base, const cuuint64_t* dim, const cuuint64_t* pitch,
                      const cuuint32_t* box, const cuuint32_t* es, CUtensorMapSwizzle swizzle) {
  static evo_encode_fn fn = nullptr;
  if (fn == nullptr) {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess
        || q != cudaDriverEntryPointSuccess || p == nullptr) return 1;
    fn = (evo_encode_fn)p;
  }
  if (((unsigned long long)base) % 16) return 1;
  return fn(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, base, dim, pitch, box, es, CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS;
}

"""


def dispatcher(name: str, shapes: list[Shape]) -> str:
    lines = [f'extern "C" int {name}(const void* A, const void* B, void* C, int M, int N, int K,',
             "                       void* workspace, cudaStream_t stream) {"]
    for s in shapes:
        lines.append(f"  if (M == {s.m} && N == {s.n} && K == {s.k}) return evo_hgemm_{s.key}(A, B, C, M, N, K, workspace, stream);")
    lines += ["  return -1;", "}", ""]
    return "\n".join(lines)


_INCLUDE = re.compile(r"^[ \t]*#[ \t]*include\b", re.M)
_CONDITIONAL = re.compile(r"^[ \t]*#[ \t]*(if|ifdef|ifndef|endif)\b")


def split_includes(source: str) -> tuple[str, str]:
    """(what goes before the unit's anonymous namespace, what goes inside it).

    A header must not be included inside a namespace. Without ``#include`` everything goes
    inside. When the includes sit in a leading block of preprocessor lines, comments and blank
    lines (balanced ``#if``s), that block goes before, unchanged, so macros the source defines
    before a header still reach it. Otherwise each include line is repeated before the namespace
    (the allowed headers are include-guarded, so the copies inside then expand to nothing)."""
    includes = list(_INCLUDE.finditer(source))
    if not includes:
        return "", source
    lines = [source[m.start():].split("\n", 1)[0] for m in includes]
    cut = source.find("\n", includes[-1].start())
    cut = len(source) if cut < 0 else cut + 1
    depth, in_comment, pure = 0, False, True
    for line in source[:cut].replace("\\\n", " ").splitlines():
        text = line.strip()
        if in_comment or text.startswith("/*"):
            inside = text if in_comment else text[2:]
            in_comment = "*/" not in inside
            rest = "" if in_comment else inside.split("*/", 1)[1].strip()
            if rest and not rest.startswith("//"):
                pure = False  # code after a comment on the same line
                break
            continue
        if not text or text.startswith("//"):
            continue
        if not text.startswith("#"):
            pure = False
            break
        m = _CONDITIONAL.match(text)
        if m:
            depth += -1 if m.group(1) == "endif" else 1
    if pure and depth == 0 and not in_comment:
        return source[:cut], source[cut:]
    return ("// the source's headers, included before the namespace (include-guarded: the lines inside add nothing)\n"
            + "".join(line + "\n" for line in lines), source)


_EXTERN_KERNEL = re.compile(r'extern\s+"C"\s+([^;{}]*?\b__global__\b[^;{}]*?)\{', re.S)
_ATTRIBUTE_CALL = re.compile(r"\b__\w+__\s*\((?:[^()]|\([^()]*\))*\)")
_NAME_CALL = re.compile(r"\b([A-Za-z_]\w*)\s*\(")


def extern_c_kernels(source: str) -> list[str]:
    """Names of the ``extern "C" __global__`` functions a source defines (attributes such as
    ``__launch_bounds__(...)`` skipped; the name is the identifier before the parameter list)."""
    names = []
    for m in _EXTERN_KERNEL.finditer(source):
        found = _NAME_CALL.search(_ATTRIBUTE_CALL.sub(" ", m.group(1)))
        if found:
            names.append(found.group(1))
    return names


def kernel_unit(shape: Shape, cand: Candidate, kernels: list[str], tag: str = "") -> str:
    """The candidate's translation unit for the library: its kernels renamed per shape (``tag``,
    default the shape's key), its code in an anonymous namespace (internal linkage: two units may
    define the same helper, constant or kernel name without breaking the library's link), and an
    accessor per launched kernel."""
    key = tag or shape.key
    head = [f"// Generated by evo export: {shape}, candidate {cand.id}. Do not edit."]
    # every extern "C" kernel is renamed, launched or not: C linkage ignores the namespace, so two
    # units defining the same unlaunched kernel would break the library's link
    head += [f"#define {k} evo_{key}_{k}" for k in dict.fromkeys([*kernels, *extern_c_kernels(cand.source)])]
    before, body = split_includes(cand.source)
    tail = [f'extern "C" const void* evo_{key}_kernel_{i}(void) {{ return (const void*)&{k}; }}'
            for i, k in enumerate(kernels)]
    return ("\n".join(head) + "\n" + before + "namespace {  // internal linkage for everything the source defines\n"
            + body + "\n}  // namespace\n\n" + "\n".join(tail) + "\n")
