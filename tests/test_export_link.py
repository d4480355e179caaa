"""``evo export`` links kernels whose sources define the same names (a real nvcc build).

Two candidates of different shapes define the same kernel that is not launched, the same host
function, the same ``__constant__`` table and the same ``__device__`` variable. Linked as they
are, the library's final link fails ("multiple definition"); the export wraps each unit's code in
an anonymous namespace, so both kernels are exported. One source also includes a header, which
must stay outside the namespace. A GPU test runs both kernels through the library.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from archive_fixture import ok as ok_eval
from evo.export._export import LIBRARY, NVCC, export, load_library
from evo.export._export_source import split_includes
from populations import Archive, Candidate, Shape, load_templates

pytestmark = pytest.mark.skipif(not Path(NVCC).exists() and not shutil.which("nvcc"), reason="nvcc is not installed")

S1, S2 = Shape(64, 64, 64), Shape(64, 128, 64)
#: Names both units define; each would collide at the link without internal linkage.
SHARED = """
// The same names in every unit: a constant table, a device variable, a helper, an unlaunched kernel, host code.
__constant__ float evo_shared_table[4] = {1.f, 2.f, 3.f, 4.f};
__device__ int evo_shared_counter;
__device__ __noinline__ float evo_shared_helper(float x) { return x * evo_shared_table[1]; }
__global__ void evo_shared_unlaunched(float* out) { out[0] = evo_shared_helper(2.f) + evo_shared_counter; }
int evo_shared_host_helper(int x) { return x + 1; }
"""


def _candidate(shape: Shape, include: bool) -> Candidate:
    t = load_templates()["tiny"]
    src, plan = t.render(t.heuristic(shape)[0], shape)
    head = "#include <cuda_fp16.h>\n" if include else ""
    return Candidate(source=head + src + SHARED, plan=plan, shapes=(shape,), operator="llm")


def _nvcc(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([NVCC, "-gencode=arch=compute_90a,code=sm_90a", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_the_shared_names_collide_without_internal_linkage(tmp_path: Path) -> None:
    """The fixture is a real collision: the same code in two plain units does not link."""
    for i in (1, 2):
        (tmp_path / f"u{i}.cu").write_text(SHARED)
        assert _nvcc("-Xcompiler", "-fPIC", "-c", f"u{i}.cu", "-o", f"u{i}.o", cwd=tmp_path).returncode == 0
    link = _nvcc("-shared", "-o", "lib.so", "u1.o", "u2.o", cwd=tmp_path)
    assert link.returncode != 0 and "multiple definition" in link.stderr


def test_export_links_kernels_with_the_same_names(tmp_path: Path) -> None:
    cands = {S1: _candidate(S1, include=True), S2: _candidate(S2, include=False)}
    with Archive(tmp_path / "arch", "w") as a:
        for shape, cand in cands.items():
            a.record(cand, [ok_eval(cand, shape, 1.2)])
    manifest = export(tmp_path / "arch", tmp_path / "lib")
    assert manifest.skipped == ()
    assert sorted(e.shape for e in manifest.kernels) == sorted(str(s) for s in cands)
    unit = (tmp_path / "lib" / "src" / f"k_{S1.key}.cu").read_text()
    assert unit.index("#include <cuda_fp16.h>") < unit.index("namespace {") < unit.index("evo_shared_host_helper")
    out = subprocess.run(["nm", "-D", "--defined-only", str(tmp_path / "lib" / LIBRARY)], capture_output=True,
                         text=True, check=True).stdout
    assert {f"evo_hgemm_{s.key}" for s in cands} <= {line.split()[-1] for line in out.splitlines()}
    assert "evo_shared" not in out  # internal to each unit, not in the library's interface


@pytest.mark.parametrize("source,before,inside", [
    ("__device__ int x;\n", "", "__device__ int x;\n"),
    ("#define A 1\n/* note\n more */\n#include <cuda_fp16.h>\n__device__ int y;\n",
     "#define A 1\n/* note\n more */\n#include <cuda_fp16.h>\n", "__device__ int y;\n"),
    ("int a;\n#include <mma.h>\n", "#include <mma.h>\n", "int a;\n#include <mma.h>\n"),  # code first: a copy
    ("#ifndef G\n#define G\n#include <mma.h>\nint z;\n#endif\n", "#include <mma.h>\n",  # an open #if: a copy
     "#ifndef G\n#define G\n#include <mma.h>\nint z;\n#endif\n"),
    ("/* c */ int q;\n#include <mma.h>\n", "#include <mma.h>\n", "/* c */ int q;\n#include <mma.h>\n"),
])
def test_headers_stay_outside_the_namespace(source: str, before: str, inside: str) -> None:
    got_before, got_inside = split_includes(source)
    assert got_inside == inside
    assert got_before.endswith(before) and got_before.count("#include") == before.count("#include")


@pytest.mark.gpu
def test_kernels_with_the_same_names_run_on_the_gpu(tmp_path: Path) -> None:
    import torch

    cands = {S1: _candidate(S1, include=True), S2: _candidate(S2, include=False)}
    with Archive(tmp_path / "arch", "w") as a:
        for shape, cand in cands.items():
            a.record(cand, [ok_eval(cand, shape, 1.2)])
    export(tmp_path / "arch", tmp_path / "lib")
    lib = load_library(tmp_path / "lib")
    if not lib.active:
        pytest.skip(f"library not usable here: {lib.reason}")
    for shape in cands:
        a = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.float16)
        b = torch.randn(shape.n, shape.k, device="cuda", dtype=torch.float16).t()
        got = lib.evo_hgemm(a, b)
        ref = torch.matmul(a.float(), b.float())
        assert (got.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item() + 1e-2, shape
