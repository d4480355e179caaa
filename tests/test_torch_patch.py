"""``evo.torch.patch``: which ``nn.Linear`` modules are patched, what is left to cuBLAS and why,
that patched modules call ``torch.ops.evo_native.linear`` and give the unpatched result, and
that unpatching restores the class's forward."""
from __future__ import annotations

import shutil

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from evo.torch import patch, patched, unpatch  # noqa: E402
from evo.torch._patch import coverage  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("c++") is None and shutil.which("g++") is None, reason="no C++ compiler")
nn = torch.nn


class LibraryDouble:
    """Test double of evo.export._export.EvoLibrary: the kernels an export lists, not loadable here (no GPU)."""

    active = False
    reason = "no CUDA device"

    def __init__(self, *keys: tuple[int, int, int, str]) -> None:
        self.kernels = {k: {"symbol": "evo_hgemm_x"} for k in keys}


class OwnForward(nn.Linear):
    def forward(self, x: "torch.Tensor") -> "torch.Tensor":
        return super().forward(x) * 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(16, 32, bias=True)             # covered (32, 16)
        self.down = nn.Linear(32, 16, bias=False)          # covered (16, 32)
        self.other = nn.Linear(16, 24)                     # no kernel for (24, 16)
        self.wide = OwnForward(16, 32)                     # its own forward
        self.hooked = nn.Linear(16, 32)                    # forward replaced by someone else
        self.hooked.forward = lambda x: nn.Linear.forward(self.hooked, x)
        self.fp32 = nn.Linear(32, 16)                      # stays float32

    def forward(self, x: "torch.Tensor") -> "torch.Tensor":
        h = self.up(x) + self.wide(x) + self.hooked(x)
        return self.down(h) + self.fp32(h.float()).half() + self.other(x)[..., :16]


def _model() -> Block:
    torch.manual_seed(0)
    m = Block().half()
    m.fp32.float()
    return m.eval()


LIB = LibraryDouble((1, 32, 16, "TN"), (8, 32, 16, "TN"), (8, 16, 32, "TN"), (8, 24, 16, "NN"))


class OpLog(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_coverage_is_tn_only() -> None:
    assert coverage(LIB) == {(32, 16): (1, 8), (16, 32): (8,)}


def test_patch_rules_and_report() -> None:
    model = _model()
    report = patch(model, LIB)
    assert [(n, N, K, ms) for n, N, K, ms in report.patched] == [("up", 32, 16, (1, 8)), ("down", 16, 32, (8,))]
    skipped = dict(report.skipped)
    assert skipped["other"] == "no exported kernel for N=24 K=16"  # an NN kernel does not serve nn.Linear
    assert skipped["wide"] == "OwnForward has its own forward"
    assert skipped["hooked"].startswith("its forward was already replaced")
    assert skipped["fp32"] == "weight is float32, not float16"
    assert "no CUDA device" in report.note and "2 nn.Linear patched, 4 left to cuBLAS" in str(report)
    again = patch(model, LIB)
    assert again.patched == [] and dict(again.skipped)["up"] == "already patched"
    assert unpatch(model) == 2 and "forward" not in vars(model.up) and not hasattr(model.up, "_evo_patched")
    assert unpatch(model) == 0


def test_patched_modules_call_the_op_and_match() -> None:
    model = _model()
    x = torch.randn(8, 16).half()
    with torch.no_grad():
        ref = model(x)
        with patched(model, LIB) as report:
            assert len(report.patched) == 2
            with OpLog() as log:
                got = model(x)
            assert log.ops.count("evo_native.linear.default") == 2
        with OpLog() as log:
            after = model(x)
    assert "evo_native.linear.default" not in log.ops
    assert torch.equal(got, ref) and torch.equal(after, ref)
    assert "forward" not in vars(model.up) and "forward" in vars(model.hooked)  # someone else's forward kept


def test_patch_with_gradients_still_trains() -> None:
    model = nn.Sequential(nn.Linear(16, 32)).half()
    with patched(model, LIB):
        model(torch.randn(8, 16).half()).float().sum().backward()
    assert model[0].weight.grad is not None


def test_uncovered_token_counts_skip_the_op() -> None:
    """A call at a token count the library lacks for that (N, K) goes straight to F.linear, without
    the native operator's fallback; a covered one calls the operator. Results are unchanged."""
    model = _model()
    torch.manual_seed(1)
    # up covers M in {1, 8}, down only 8; M counts every leading dimension (2 x 4 = 8)
    cases = [((8, 16), 2), ((1, 16), 1), ((4, 16), 0), ((0, 16), 0), ((2, 4, 16), 2)]
    inputs = [torch.randn(*shape).half() for shape, _ in cases]
    with torch.no_grad():
        refs = [model(x) for x in inputs]
        with patched(model, LIB):
            for x, ref, (shape, calls) in zip(inputs, refs, cases):
                with OpLog() as log:
                    got = model(x)
                assert log.ops.count("evo_native.linear.default") == calls, shape
                assert torch.equal(got, ref), shape
    assert not hasattr(model.up, "_evo_rows")


class StagingLibraryDouble(LibraryDouble):
    """Test double of an active EvoLibrary whose kernels for (32, 12) stage B (K % 8 != 0): its
    launchers are the address of a libc function that nothing calls (CPU tensors take the
    operator's fallback), and ``prepare_weight`` pads on the CPU as the real one does on a GPU."""

    active = True
    reason = ""

    def __init__(self, *keys: tuple[int, int, int, str]) -> None:
        from types import SimpleNamespace

        super().__init__(*keys)
        self.kernels = {k: SimpleNamespace(symbol="evo_hgemm_x", prepared_b=SimpleNamespace(symbol="evo_hgemm_x_wb"))
                        for k in keys}  # as evo.runtime.KernelEntry
        self.pads = 0

    def launcher(self, key: tuple[int, int, int, str]) -> tuple[object, int]:
        import ctypes

        return ctypes.CDLL(None).abs, 0

    def prepared_launcher(self, key: tuple[int, int, int, str]) -> object:
        return self.launcher(key)[0]

    def prepare_weight(self, weight: "torch.Tensor") -> object:
        from types import SimpleNamespace

        self.pads += 1
        n, k = weight.shape
        padded = torch.zeros((n, -(-k // 64) * 64), dtype=weight.dtype)
        padded[:, :k] = weight
        return SimpleNamespace(weight=weight, padded=padded)


def test_a_staging_kernel_gets_the_weight_padded_once_and_kept_fresh() -> None:
    lib = StagingLibraryDouble((8, 32, 12, "TN"))
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(12, 32), nn.Linear(32, 12)).half().eval()
    x = torch.randn(8, 12).half()
    with torch.no_grad():
        ref = model[0](x)
        with patched(model, lib) as report:
            assert report.prepared == ["0"] and "(weight padded once)" in str(report)
            assert [p[0] for p in report.patched] == ["0"] and lib.pads == 1
            with OpLog() as log:
                got = model[0](x)
            assert log.ops.count("evo_native.linear_prepared.default") == 1 and torch.equal(got, ref)
            model[0](x)
            assert lib.pads == 1  # an unchanged weight is not padded again
            model[0].weight.mul_(2)  # in place: the next call pads again
            model[0](x)
            assert lib.pads == 2 and torch.equal(model[0]._evo_wpad[:, :12], model[0].weight)
            model[0].weight = nn.Parameter(torch.randn(32, 12).half())  # replaced
            assert torch.equal(model[0](x), nn.functional.linear(x, model[0].weight, model[0].bias))
            assert lib.pads == 3
        assert not hasattr(model[0], "_evo_wpad") and not hasattr(model[0], "_evo_wpad_of")
