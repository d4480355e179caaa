"""``evo export`` on the GPU: the exported library beside torch, including 2-CTA cluster kernels.

The fixture archive (``archive_fixture.build``: tiny, sm80_mma TN and NN, sm90_wgmma with its
split-K workspace) plus two sm90_wgmma candidates with ``CLUSTER_M`` 2 (compile-time
``__cluster_dims__(2, 1, 1)``, B multicast across the pair), TN and NN, exported with nvcc for
sm_90a. On the CPU: the export builds and the library holds sm_90a machine code for every
kernel. On a GPU (``-m gpu``): every exported shape through ``evo_hgemm`` matches an fp32
reference on fresh inputs; unknown shapes, a shape whose kernel did not compile (left out of the
library) and misaligned views fall back to torch.matmul; the
cluster kernels run correctly on a side stream and inside a captured CUDA graph (the library's
own CUDA runtime shares torch's context and stream).
"""
from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

import evo
from archive_fixture import build, ok
from evo.export._export import LIBRARY, export, load_library
from populations import Archive, Candidate, Shape, load_templates

NVCC = Path("/usr/local/cuda/bin/nvcc")
pytestmark = pytest.mark.skipif(not NVCC.exists() and not shutil.which("nvcc"), reason="nvcc is not installed")

S_CL_TN = Shape(512, 768, 512)
S_CL_NN = Shape(256, 384, 256, "NN")


def cluster_candidate(shape: Shape) -> Candidate:
    """The template's first pick for ``shape`` with a 2-CTA cluster (BN a multiple of 128) and no
    split-K, so that these shapes test the cluster launch alone (the fixture's 512^3 wgmma kernel
    covers split-K and its workspace)."""
    t = load_templates()["sm90_wgmma"]
    knobs = dict(t.heuristic(shape)[0])
    knobs["CLUSTER_M"] = 2
    if "SPLIT_K" in knobs:
        knobs["SPLIT_K"] = 1
    if knobs["BN"] % 128:
        knobs["BN"] = 128
    t.check(knobs, shape)
    return t.candidate(knobs, shape)


S_BROKEN = Shape(128, 128, 128)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[Shape, Candidate]]:
    """The library, and the best candidate per exported shape. S_BROKEN's best kernel does not
    compile: it is left out, the other kernels are exported."""
    root = tmp_path_factory.mktemp("export_gpu")
    best = build(root / "arch")
    t = load_templates()["tiny"]
    src, plan = t.render(t.heuristic(S_BROKEN)[0], S_BROKEN)
    broken = Candidate(source=src + "\n#error deliberately broken\n", plan=plan, shapes=(S_BROKEN,))
    with Archive(root / "arch", "w") as a:
        for shape in (S_CL_TN, S_CL_NN):
            c = cluster_candidate(shape)
            a.record(c, [ok(c, shape, 1.4)])
            best[shape] = c
        a.record(broken, [ok(broken, S_BROKEN, 3.0)])
    export(root / "arch", root / "lib")
    return root / "lib", best


def test_export_builds_for_sm90a_and_leaves_out_a_broken_kernel(exported: tuple[Path, dict[Shape, Candidate]]) -> None:
    lib, best = exported
    loaded = load_library(lib)
    assert {Shape.parse(e.shape) for e in loaded.manifest.kernels} == set(best)
    skipped = {s["shape"]: s["reason"] for s in loaded.manifest.skipped}
    assert "deliberately broken" in skipped[str(S_BROKEN)] and not (lib / "src" / f"k_{S_BROKEN.key}.cu").exists()
    for shape in (S_CL_TN, S_CL_NN):
        entry = loaded.kernels[(shape.m, shape.n, shape.k, shape.layout)]
        assert entry.candidate == best[shape].id and entry.knobs["CLUSTER_M"] == 2
        unit = (lib / "src" / f"k_{shape.key}.cu").read_text()
        assert "__cluster_dims__(CLUSTER, 1, 1)" in unit and "#define CLUSTER 2" in unit.splitlines()
        launches, _ = best[shape].plan.resolve(shape)
        assert launches[0].grid[0] % 2 == 0  # a grid of whole clusters: the classic launch is valid
    # The machine code in the library (no cuobjdump here): every embedded CUDA ELF (e_machine 190)
    # is for SM 90 (e_flags bits 8-15), one per kernel unit at least, and ptxas recorded sm_90a.
    data = (lib / LIBRARY).read_bytes()
    sms, at = [], data.find(b"\x7fELF", 1)
    while at >= 0:
        if data[at + 4] == 2 and struct.unpack_from("<H", data, at + 18)[0] == 190:
            sms.append(struct.unpack_from("<I", data, at + 48)[0] >> 8 & 0xFF)
        at = data.find(b"\x7fELF", at + 4)
    assert len(sms) >= len(best) and set(sms) == {90}, sms
    archs = set(re.findall(rb"-arch (sm_\w+)", data))
    assert archs == {b"sm_90a"}, archs


# -- on the GPU ---------------------------------------------------------------------------------
def _operands(shape: Shape) -> tuple[Any, Any]:
    import torch

    a = torch.empty(shape.m, shape.k, device="cuda", dtype=torch.float16).uniform_(-1, 1)
    if shape.layout == "TN":
        b = torch.empty(shape.n, shape.k, device="cuda", dtype=torch.float16).uniform_(-1, 1).t()
    else:
        b = torch.empty(shape.k, shape.n, device="cuda", dtype=torch.float16).uniform_(-1, 1)
    return a, b


def _assert_close(got: Any, a: Any, b: Any, what: object) -> None:
    from evaluators.correctness import tolerance_random

    a32, b32 = a.float(), b.float()
    ref = a32 @ b32
    tol = tolerance_random(ref, ((a32 * a32) @ (b32 * b32)).sqrt())
    err = (got.float() - ref).abs()
    assert not got.isnan().any(), f"{what}: NaN in the output"
    assert bool((err <= tol).all()), f"{what}: worst error {float((err / tol).max()):.2f}x the tolerance"


@pytest.fixture(scope="module")
def on_gpu(exported: tuple[Path, dict[Shape, Candidate]]) -> Any:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    loaded = load_library(exported[0])
    assert loaded.active, loaded.reason  # an H200 must be able to use an sm_90a library
    return loaded


@pytest.mark.gpu
def test_known_shapes_run_the_exported_kernel(exported: tuple[Path, dict[Shape, Candidate]], on_gpu: Any) -> None:
    import torch

    for shape in exported[1]:
        a, b = _operands(shape)
        assert on_gpu.route(a, b) == (shape.m, shape.n, shape.k, shape.layout), shape
        for call in (on_gpu.evo_hgemm, evo.evo_hgemm, torch.ops.evo.hgemm):
            got = call(a, b)
            torch.cuda.synchronize()
            _assert_close(got, a, b, (shape, call))


@pytest.mark.gpu
def test_unknown_shapes_and_misaligned_views_fall_back(on_gpu: Any) -> None:
    import torch

    for shape in (Shape(96, 80, 48), S_BROKEN):  # never archived; archived but its kernel did not build
        a, b = _operands(shape)
        assert on_gpu.route(a, b) is None
        assert torch.equal(evo.evo_hgemm(a, b), torch.matmul(a, b))
    # a known shape, but A starts 2 bytes into its allocation: torch.matmul does it
    big = torch.empty(64 * 64 + 1, device="cuda", dtype=torch.float16).uniform_(-1, 1)
    a2 = big[1:].view(64, 64)
    b2 = torch.empty(64, 64, device="cuda", dtype=torch.float16).uniform_(-1, 1).t()
    assert on_gpu.route(a2, b2) is None
    assert torch.equal(evo.evo_hgemm(a2, b2), torch.matmul(a2, b2))


@pytest.mark.gpu
def test_cluster_kernels_on_a_side_stream_and_in_a_graph(on_gpu: Any) -> None:
    import torch

    for shape in (S_CL_TN, S_CL_NN):
        key = (shape.m, shape.n, shape.k, shape.layout)
        fn, ws = on_gpu.launcher(key)
        assert ws == on_gpu.kernels[key].workspace_bytes
        a, b = _operands(shape)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            got = on_gpu.evo_hgemm(a, b)
        torch.cuda.synchronize()
        _assert_close(got, a, b, (shape, "side stream"))
        # capture three calls into a graph, change the inputs in place, replay: fresh results
        outs = []
        g = torch.cuda.CUDAGraph()
        on_gpu.evo_hgemm(a, b)  # warm: module loaded, shared memory opt-in done outside capture
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            for _ in range(3):
                outs.append(on_gpu.evo_hgemm(a, b))
        a.uniform_(-1, 1)
        g.replay()
        torch.cuda.synchronize()
        for c in outs:
            _assert_close(c, a, b, (shape, "graph replay"))
