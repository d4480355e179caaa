"""A plan whose CTAs wait on each other (``coresident``: the stream-K templates) is launched by the
exported library only where its whole grid can be resident; elsewhere the launcher answers -1 and
the caller runs cuBLAS. CPU: the flag's round trip, which templates set it, and the generated
launcher compiled by nvcc; the device decides the rest."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from evo.export._export import _FLAGS, NVCC
from evo.export._export_source import PRELUDE, launcher
from populations import LaunchPlan, Shape, load_templates

SHAPE = Shape.parse("128x8192x2048")


def _first(name: str):
    t = load_templates()[name]
    return t.candidate(t.heuristic(SHAPE)[0], SHAPE)


def test_the_flag_round_trips_and_only_the_stream_k_templates_set_it() -> None:
    templates = load_templates()
    set_by = {n for n, t in templates.items() if t.applicable(SHAPE) and _first(n).plan.coresident}
    assert {"streamk", "streamk90"} <= set_by and not set_by & {"sm80_mma", "sm90_wgmma", "tiny", "gemv"}
    sk = _first("streamk")
    assert LaunchPlan.from_dict(sk.plan.to_dict()) == sk.plan and sk.plan.to_dict()["coresident"] is True
    plain = _first("sm80_mma").plan
    assert "coresident" not in plain.to_dict()  # other plans (and their candidate ids) are as before
    assert LaunchPlan.from_dict({**sk.plan.to_dict(), "coresident": False}).coresident is False


def test_the_launcher_checks_residency_once_per_device_and_answers_minus_one() -> None:
    sk, plain = _first("streamk"), _first("sm80_mma")
    src, _ = launcher(SHAPE, sk, ["evo_streamk"])
    rl = sk.plan.resolve(SHAPE)[0][0]
    ctas, threads = rl.grid[0] * rl.grid[1] * rl.grid[2], rl.block[0] * rl.block[1] * rl.block[2]
    assert f"if (!evo_resident(f, {ctas}ll, {threads}, {rl.smem}, evo_fit_{SHAPE.key}_0)) return -1;" in src
    assert src.index("evo_smem_ready") < src.index("evo_resident") < src.index("cudaLaunchKernel")  # occupancy after the opt-in
    assert "evo_resident" not in launcher(SHAPE, plain, [k for k in _kernels(plain)])[0]


def _kernels(cand) -> list[str]:
    return sorted({launch.kernel for launch in cand.plan.launches})


@pytest.mark.skipif(not Path(NVCC).exists() and not shutil.which("nvcc"), reason="nvcc is not installed")
def test_the_generated_launcher_compiles(tmp_path: Path) -> None:
    sk = _first("streamk")
    src, _ = launcher(SHAPE, sk, ["evo_streamk"])
    (tmp_path / "launchers.cu").write_text(PRELUDE + src)
    nvcc = NVCC if Path(NVCC).exists() else shutil.which("nvcc")
    out = subprocess.run([nvcc, *_FLAGS, "-c", "launchers.cu", "-o", "launchers.o"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]


def test_the_worker_refuses_a_grid_that_cannot_be_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluator's bind step: a coresident launch larger than SMs x CTAs per SM is a PlanError
    (the candidate is rejected, never launched to hang); a loader that cannot say skips the check.
    The loader is a test double (the occupancy query is the driver's); the GPU's SM count too."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from evaluators.run._kernels import CandidateKernels
    from populations import PlanError

    class Occupancy:
        """A test double of the loader's occupancy query."""

        def __init__(self, per_sm):  # type: ignore[no-untyped-def]
            self.per_sm = per_sm

        def resident_blocks(self, fn, threads, smem):  # type: ignore[no-untyped-def]
            return self.per_sm

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(multi_processor_count=114))
    kernels = CandidateKernels.__new__(CandidateKernels)
    launch = SimpleNamespace(kernel="evo_streamk", grid=(132, 1, 1), block=(128, 1, 1), smem=65536)
    kernels.loader = Occupancy(1)
    with pytest.raises(PlanError, match=r"132 CTAs wait on each other .* holds 114 \(114 SMs x 1\)"):
        kernels._check_resident(None, launch)
    kernels.loader = Occupancy(2)  # two per SM: 228 fit
    kernels._check_resident(None, launch)
    kernels.loader = Occupancy(None)  # pycuda: not known, not refused
    kernels._check_resident(None, launch)
