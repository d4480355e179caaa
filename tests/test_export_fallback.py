"""``evo export`` is never slower than cuBLAS: the per-shape choice between the evolved kernel
and cuBLAS (``choose_path``), and a real nvcc export whose manifest says which path every shape
takes and why, with the dispatcher answering -1 (cuBLAS) for the shapes left to cuBLAS."""
from __future__ import annotations

import ctypes
import shutil
from pathlib import Path

import pytest

from archive_fixture import first_pick, ok
from evo.export._export import LIBRARY, choose_path, export
from evo.runtime import ExportManifest
from evo.cli import main
from populations import Archive, Elite, Evaluation, Shape, Status

NVCC = Path("/usr/local/cuda/bin/nvcc")


def _elite(speedups: list[float]) -> Elite:
    cand = first_pick("tiny", Shape(64, 64, 64))
    evals = tuple(ok(cand, Shape(64, 64, 64), s) for s in speedups)
    ordered = sorted(e.fitness for e in evals)  # type: ignore[type-var]
    return Elite(cand.id, ordered[len(ordered) // 2], evals, cand)


@pytest.mark.parametrize("speedups, path", [([1.2], "evolved"), ([1.021], "evolved"), ([1.001], "cublas"),
                                            ([1.019], "cublas"), ([1.0], "cublas"),
                                            ([0.97], "cublas"), ([0.9, 1.3, 0.95], "cublas"), ([1.1, 0.99, 1.2], "evolved")])
def test_choose_path_by_the_median_device_speedup(speedups: list[float], path: str) -> None:
    elite = _elite(speedups)
    got, why = choose_path(elite)
    assert got == path and elite.candidate_id in why and f"{elite.fitness:.3f}x" in why
    assert f"{len(speedups)} measurement" in why
    if path == "cublas":
        assert "not faster than cuBLAS" in why
        assert choose_path(elite, keep_slower=True)[0] == "evolved"


def test_choose_path_without_a_kernel() -> None:
    path, why = choose_path(None, "no ok, unflagged measurement")
    assert path == "cublas" and "no exportable kernel" in why and "no ok" in why


@pytest.mark.skipif(not NVCC.exists() and not shutil.which("nvcc"), reason="nvcc is not installed")
def test_export_leaves_slower_shapes_to_cublas(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fast, slow, tie, none = Shape(64, 64, 64), Shape(64, 128, 64), Shape(128, 64, 64), Shape(96, 64, 64)
    with Archive(tmp_path / "arch", "w") as a:
        for shape, speed in ((fast, 1.31), (slow, 0.97), (tie, 1.0)):
            c = first_pick("tiny", shape)
            a.record(c, [ok(c, shape, speed)])
        c = first_pick("tiny", none)
        a.record(c, [Evaluation(c.id, none, Status.INCORRECT, message="max error 3.2", arch="sm_90a")])
    assert main(["export", str(tmp_path / "arch"), "--out", str(tmp_path / "lib"), "--verify", "off"]) == 0  # the archive decides
    printed = capsys.readouterr().out
    manifest = ExportManifest.read(tmp_path / "lib")  # the record, from what the command wrote
    assert [e.shape for e in manifest.kernels] == [str(fast)]
    assert manifest.kernels[0].why.endswith("1.310x of cuBLAS in GPU time (median device speedup of 1 measurement)")
    paths = manifest.paths
    assert set(paths) == {str(s) for s in (fast, slow, tie, none)}
    assert paths[str(fast)]["path"] == "evolved"
    assert {paths[str(s)]["path"] for s in (slow, tie, none)} == {"cublas"}
    assert "0.970x" in paths[str(slow)]["why"] and "1.000x" in paths[str(tie)]["why"]
    assert "no ok" in paths[str(none)]["why"]
    assert f"{str(slow):>26}  cuBLAS: " in printed and "(not re-timed: --verify off)" in printed
    assert manifest.verify == {"ran": False, "why": "--verify off"}
    so = ctypes.CDLL(str(tmp_path / "lib" / LIBRARY))
    so.evo_hgemm.restype = ctypes.c_int
    so.evo_hgemm.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2
    for s in (slow, tie, none):  # no launcher: -1, the caller's cue to run cuBLAS (no GPU touched)
        assert so.evo_hgemm(None, None, None, s.m, s.n, s.k, None, None) == -1
    assert not hasattr(so, f"evo_hgemm_{slow.key}")
    kept = export(tmp_path / "arch", tmp_path / "all", keep_slower=True)
    assert sorted(e.shape for e in kept.kernels) == sorted(str(s) for s in (fast, slow, tie))
    assert all(v["path"] == "evolved" for k, v in kept.paths.items() if k != str(none))
