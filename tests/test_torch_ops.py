"""The native operators ``torch.ops.evo_native.mm`` / ``.linear`` (evo/torch/evo_ops.cpp).

CPU tests build the real operator with the C++ compiler here, against the CPU torch here: its
CUDA kernel is then absent (``has_cuda()`` is False) and every call is the at::matmul /
at::linear fallback, which is what these tests check, with the registration, the dispatch
table, the Meta kernel (fake tensors, torch.compile) and the autograd rule. The GPU test runs a
real export's kernels through the operator, inside a CUDA graph and under torch.compile.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from evo.torch import _ops  # noqa: E402
from evo.torch._ops import OpsBuildError, build_command, load_ops, register  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")


@pytest.fixture(scope="module")
def ops() -> object:
    load_ops()
    return torch.ops.evo_native


class InactiveLibrary:
    """Test double of evo.export._export.EvoLibrary where it cannot be used (no GPU): kernels listed, none loaded."""

    active = False
    reason = "no CUDA device"
    kernels = {(4, 6, 8, "TN"): {}}


def test_build_is_cached_and_for_this_torch(ops: object) -> None:
    so = load_ops()
    assert so.is_file() and so.parent.parent == _ops.cache_dir() and load_ops() == so
    assert ops.has_cuda() == (torch.version.cuda is not None)
    cmd = build_command(Path("/tmp/x.so"), cuda=False)
    assert "-DEVO_WITH_CUDA" not in cmd and str(_ops.SOURCE) in cmd
    assert f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}" in cmd


def test_fallbacks_equal_matmul_and_linear(ops: object) -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(5, 8, generator=gen).half()
    w = torch.randn(6, 8, generator=gen).half()
    bias = torch.randn(6, generator=gen).half()
    x3 = torch.randn(2, 3, 8, generator=gen).half()
    assert torch.equal(ops.mm(a, w.t()), torch.matmul(a, w.t()))
    assert torch.equal(ops.linear(a, w, bias), torch.nn.functional.linear(a, w, bias))
    assert torch.equal(ops.linear(x3, w), torch.nn.functional.linear(x3, w))
    assert torch.equal(ops.linear(x3.float(), w.float(), None), torch.nn.functional.linear(x3.float(), w.float()))
    with pytest.raises(RuntimeError):
        ops.mm(a, w)  # 5x8 @ 6x8: the fallback's own error, not a silent wrong answer
    pad = torch.zeros(6, 64).half()
    pad[:, :8] = w
    assert torch.equal(ops.linear_prepared(a, w, pad, bias), torch.nn.functional.linear(a, w, bias))
    assert torch.equal(ops.linear_prepared(x3, w, pad), torch.nn.functional.linear(x3, w))
    ops.register_kernel(5, 6, 8, "TN", 1, 0)
    ops.register_prepared(5, 6, 8, 1)  # beside a registered kernel; alone it is refused
    with pytest.raises(RuntimeError, match="before its prepared-B launcher"):
        ops.register_prepared(5, 6, 9, 1)
    ops.clear_kernels()


def test_meta_fake_and_compile(ops: object) -> None:
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    out = ops.linear(torch.empty(3, 5, 8, dtype=torch.half, device="meta"), torch.empty(6, 8, dtype=torch.half, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 5, 6) and out.dtype == torch.half
    with FakeTensorMode():
        y = ops.mm(torch.empty(4, 8, dtype=torch.half), torch.empty(8, 6, dtype=torch.half))
    assert isinstance(y, FakeTensor) and y.shape == (4, 6)
    f = torch.compile(lambda x, w: ops.linear(x, w, None) * 2, backend="aot_eager", fullgraph=True)
    a, w = torch.randn(4, 8).half(), torch.randn(6, 8).half()
    assert torch.equal(f(a, w), torch.nn.functional.linear(a, w) * 2)


def test_gradients_take_the_differentiable_path(ops: object) -> None:
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(6, 8, requires_grad=True)
    ops.linear(x, w, None).sum().backward()
    assert x.grad is not None and torch.allclose(w.grad, x.detach().sum(0).expand(6, 8))
    with torch.no_grad():
        assert not ops.mm(x, w.t()).requires_grad


def test_dispatch_table(ops: object) -> None:
    ops.clear_kernels()
    ops.register_kernel(4, 6, 8, "TN", 4096, 0)  # an address never called: CPU calls do not look it up
    ops.register_kernel(4, 6, 8, "NN", 4096, 64)
    assert ops.kernel_count() == 2
    a, w = torch.randn(4, 8).half(), torch.randn(6, 8).half()
    assert torch.equal(ops.linear(a, w), torch.nn.functional.linear(a, w))
    for bad in ((4, 6, 8, "TT", 4096, 0), (0, 6, 8, "TN", 4096, 0), (4, 6, 1 << 21, "TN", 4096, 0), (4, 6, 8, "TN", 0, 0)):
        with pytest.raises(RuntimeError):
            ops.register_kernel(*bad)
    assert register(InactiveLibrary()) == 0 and ops.kernel_count() == 0
    assert _ops.registered().__class__ is InactiveLibrary


def test_call_counts_are_cuda_calls_only(ops: object) -> None:
    """call_counts() counts CUDA calls (evolved, fallback); CPU and Meta calls are not counted, and
    reset_counts() zeroes them (the end-to-end bench reads them around a graph's capture)."""
    from evo.torch import call_counts, reset_counts

    reset_counts()
    a, w = torch.randn(4, 8).half(), torch.randn(6, 8).half()
    ops.linear(a, w)
    ops.mm(a, w.t())
    ops.linear(torch.empty(4, 8, dtype=torch.half, device="meta"), torch.empty(6, 8, dtype=torch.half, device="meta"))
    assert call_counts() == (0, 0) and ops.call_counts() == [0, 0]


def test_build_error_names_the_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ops, "_LOADED", None)
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    with pytest.raises(OpsBuildError, match="no C\\+\\+ compiler"):
        load_ops()


@pytest.mark.gpu
def test_exported_kernels_through_the_op(tmp_path: Path, ops: object) -> None:
    """On the GPU: a real export's kernels through the operator, eager, in a CUDA graph, compiled."""
    from archive_fixture import build

    from evo.export._export import export, load_library

    build(tmp_path / "arch")
    export(tmp_path / "arch", tmp_path / "lib", keep_slower=True)
    lib = load_library(tmp_path / "lib")
    if not lib.active:
        pytest.skip(f"library not usable here: {lib.reason}")
    assert ops.has_cuda() and register(lib) == len(lib.kernels)
    from evo.torch import call_counts, reset_counts

    reset_counts()
    x = torch.randn(3, 7, device="cuda", dtype=torch.half)
    ops.linear(x, torch.randn(5, 7, device="cuda", dtype=torch.half))  # no kernel for 3x5x7: a fallback
    assert call_counts() == (0, 1)
    for (m, n, k, layout) in lib.kernels:
        a = torch.randn(m, k, device="cuda", dtype=torch.half)
        w = torch.randn(n, k, device="cuda", dtype=torch.half)
        b = w.t() if layout == "TN" else torch.randn(k, n, device="cuda", dtype=torch.half)
        ref = torch.matmul(a.float(), b.float())
        tol = 1e-2 * ref.abs().max().item() + 1e-2
        got = ops.mm(a, b)
        assert (got.float() - ref).abs().max().item() <= tol
        if layout == "TN":
            bias = torch.randn(n, device="cuda", dtype=torch.half)
            lin = ops.linear(a, w, bias)
            assert (lin.float() - (ref + bias.float())).abs().max().item() <= tol + 1e-2
            g = torch.cuda.CUDAGraph()
            static = torch.empty_like(got)
            with torch.cuda.graph(g):
                static.copy_(ops.mm(a, b))
            static.zero_()
            g.replay()
            torch.cuda.synchronize()
            assert (static.float() - ref).abs().max().item() <= tol
            f = torch.compile(lambda x, ww: ops.linear(x, ww, None), fullgraph=True)
            assert (f(a, w).float() - ref).abs().max().item() <= tol
    assert call_counts()[0] >= len(lib.kernels)  # every exported shape took its kernel at least once
    ops.clear_kernels()
