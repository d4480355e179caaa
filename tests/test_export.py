"""``evo export`` and ``evo.load_library``: a real nvcc build of the fixture archive's best kernels.

CPU tests: the manifest round-trip, the exported symbols (``nm -D``), the real library's
dispatcher answering -1 for unknown shapes (called through ctypes; no GPU needed for that path),
the torch loader falling back to torch.matmul here (no GPU), and bad input leaving nothing behind.
The GPU test runs every exported kernel through ``evo_hgemm`` against torch.matmul.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

import evo
from archive_fixture import S_F16, S_FAIL, S_MMA, S_NN, S_TINY, S_WGMMA, build
from archive_fixture import ok as ok_eval
from evo.export._export import LIBRARY, MANIFEST_FORMAT, ExportError, export, load_library
from evo.cli import main
from populations import Archive, Candidate, Shape, load_templates

NVCC = Path("/usr/local/cuda/bin/nvcc")
pytestmark = pytest.mark.skipif(not NVCC.exists() and not shutil.which("nvcc"), reason="nvcc is not installed")


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict, dict[Shape, Candidate]]:
    root = tmp_path_factory.mktemp("export")
    best = build(root / "arch")
    # --verify off: these tests check the archive's decision (on a GPU, auto would re-time first)
    code = main(["export", str(root / "arch"), "--out", str(root / "lib"), "--verify", "off"])
    assert code == 0
    return root / "arch", root / "lib", json.loads((root / "lib" / "manifest.json").read_text()), best


def test_manifest_round_trip(exported: tuple[Path, Path, dict, dict[Shape, Candidate]]) -> None:
    arch, lib, manifest, best = exported
    assert manifest["format"] == MANIFEST_FORMAT and manifest["arch"] == "sm_90a"
    assert (lib / LIBRARY).is_file() and sorted(os.listdir(lib)) == sorted([LIBRARY, "manifest.json", "src"])
    by_shape = {Shape.parse(e["shape"]): e for e in manifest["kernels"]}
    assert set(by_shape) == set(best)  # the f16 and the all-failures shapes are skipped
    for shape, cand in best.items():
        e = by_shape[shape]
        assert e["candidate"] == cand.id  # the flagged grandchild at S_MMA lost to its parent
        assert e["source_sha256"] == hashlib.sha256(cand.source.encode()).hexdigest()
        assert e["layout"] == shape.layout and e["contract"] == "f32" and e["template"] == cand.template
        assert set(e["speedups"]) == {"device", "offline", "server"}
        assert e["provenance"]["gpu"] == "NVIDIA H200" and e["arch"] == "sm_90a"
        unit = (lib / "src" / f"k_{shape.key}.cu").read_text()
        assert hashlib.sha256(unit.encode()).hexdigest() == e["unit_sha256"] and cand.source in unit
    assert by_shape[S_MMA]["speedups"]["device"] == pytest.approx(1.08)
    assert by_shape[S_WGMMA]["tensor_maps"] == ["tmA", "tmB"]
    skipped = {s["shape"]: s["reason"] for s in manifest["skipped"]}
    assert "no ok" in skipped[str(S_FAIL)] and "f16" in skipped[str(S_F16)]
    loaded = load_library(lib)
    assert loaded.manifest.to_dict() == manifest  # the record read back writes the same JSON
    assert set(loaded.kernels) == {(s.m, s.n, s.k, s.layout) for s in best}


def test_library_exports_the_abi(exported: tuple[Path, Path, dict, dict[Shape, Candidate]]) -> None:
    _, lib, manifest, best = exported
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib / LIBRARY)], capture_output=True, text=True, check=True)
    symbols = {line.split()[-1] for line in out.stdout.splitlines() if " T " in line}
    assert {"evo_hgemm", "evo_hgemm_nn"} | {f"evo_hgemm_{s.key}" for s in best} <= symbols
    text = (lib / "src" / "launchers.cu").read_text()
    for shape, cand in best.items():  # the plan resolved at export time: its grid, block and smem as constants
        launches, _ = cand.plan.resolve(shape)
        for rl in launches:
            assert (f"dim3({rl.grid[0]}, {rl.grid[1]}, {rl.grid[2]}), dim3({rl.block[0]}, {rl.block[1]}, {rl.block[2]}), "
                    f"args") in text and f", {rl.smem}, stream)" in text
    assert text.count("evo_encode(&tm_") == 2  # the wgmma kernel's two TMA descriptors, encoded per call


def test_dispatcher_through_ctypes_without_a_gpu(exported: tuple[Path, Path, dict, dict[Shape, Candidate]]) -> None:
    """The real .so loads without a driver; unknown shapes and mismatched sizes never touch CUDA."""
    _, lib, _, _ = exported
    so = ctypes.CDLL(str(lib / LIBRARY))
    for name in ("evo_hgemm", "evo_hgemm_nn", f"evo_hgemm_{S_TINY.key}"):
        fn = getattr(so, name)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2
    assert so.evo_hgemm(None, None, None, 7, 7, 7, None, None) == -1
    assert so.evo_hgemm(None, None, None, S_NN.m, S_NN.n, S_NN.k, None, None) == -1  # an NN shape, asked as TN
    assert so.evo_hgemm_nn(None, None, None, S_TINY.m, S_TINY.n, S_TINY.k, None, None) == -1
    assert getattr(so, f"evo_hgemm_{S_TINY.key}")(None, None, None, 1, 2, 3, None, None) == -2


def test_loader_falls_back_to_matmul(exported: tuple[Path, Path, dict, dict[Shape, Candidate]], tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    _, lib, _, _ = exported
    loaded = load_library(lib)
    if not torch.cuda.is_available():
        assert not loaded.active and loaded.reason == "no CUDA device"
    gen = torch.Generator().manual_seed(0)
    for m, n, k in ((S_TINY.m, S_TINY.n, S_TINY.k), (7, 9, 5)):  # known and unknown shapes, CPU tensors
        a = torch.randn(m, k, generator=gen).half()
        w = torch.randn(n, k, generator=gen).half()
        ref = torch.matmul(a, w.t())
        assert loaded.route(a, w.t()) is None
        assert torch.equal(loaded.evo_hgemm(a, w.t()), ref)
        assert torch.equal(evo.evo_hgemm(a, w.t()), ref)
        assert torch.equal(torch.ops.evo.hgemm(a, w.t()), ref)
    # no library file: still usable, everything goes to torch.matmul
    (tmp_path / "lib").mkdir()
    shutil.copy(lib / "manifest.json", tmp_path / "lib" / "manifest.json")
    gone = load_library(tmp_path / "lib")
    assert not gone.active and gone.reason
    a = torch.ones(4, 4, dtype=torch.float16)
    assert torch.equal(gone.evo_hgemm(a, a), torch.matmul(a, a))
    with pytest.raises(ExportError):
        load_library(tmp_path / "nothing")


def _leftovers(parent: Path, name: str) -> list[str]:
    return [p for p in os.listdir(parent) if name in p]


@pytest.mark.parametrize("case", ["missing", "not_archive", "out_is_file_dir", "bad_arch"])
def test_bad_input(case: str, exported: tuple[Path, Path, dict, dict[Shape, Candidate]], tmp_path: Path,
                   capsys: pytest.CaptureFixture[str]) -> None:
    arch = exported[0]
    out = tmp_path / "lib"
    argv = ["export", str(arch), "--out", str(out)]
    if case == "missing":
        argv[1] = str(tmp_path / "nope")
    elif case == "not_archive":
        (tmp_path / "plain").mkdir()
        argv[1] = str(tmp_path / "plain")
    elif case == "out_is_file_dir":
        out.mkdir()
        (out / "precious.txt").write_text("keep me")
    else:
        argv += ["--arch", "hopper"]  # sm90, 90 and 9.0 are spellings of sm_90a (docs/cli.md)
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and captured.err.startswith("evo export: ")
    if case == "out_is_file_dir":
        assert os.listdir(out) == ["precious.txt"]
    else:
        assert not out.exists()
    assert _leftovers(tmp_path, ".lib.") == []


def test_failed_build_leaves_nothing(tmp_path: Path) -> None:
    """A kernel nvcc refuses: exit 2, no library, no temporary directory, an earlier export kept."""
    t = load_templates()["tiny"]
    src, plan = t.render(t.heuristic(S_TINY)[0], S_TINY)
    broken = Candidate(source=src + "\n#error deliberately broken\n", plan=plan, shapes=(S_TINY,))
    with Archive(tmp_path / "arch", "w") as a:
        a.record(broken, [ok_eval(broken, S_TINY, 1.5)])
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "manifest.json").write_text('{"format": "evo-export/1", "kernels": []}')
    with pytest.raises(ExportError, match="deliberately broken"):
        export(tmp_path / "arch", tmp_path / "lib")
    assert os.listdir(tmp_path / "lib") == ["manifest.json"]
    assert sorted(os.listdir(tmp_path)) == ["arch", "lib"]


@pytest.mark.gpu
def test_exported_kernels_match_matmul_on_the_gpu(exported: tuple[Path, Path, dict, dict[Shape, Candidate]]) -> None:
    """On a GPU of the library's arch, every exported shape runs its kernel and matches torch.matmul."""
    import torch

    _, lib, _, best = exported
    loaded = load_library(lib)
    if not loaded.active:
        pytest.skip(f"library not usable here: {loaded.reason}")
    for shape in best:
        a = torch.randn(shape.m, shape.k, device="cuda", dtype=torch.float16)
        b = (torch.randn(shape.n, shape.k, device="cuda", dtype=torch.float16).t() if shape.layout == "TN"
             else torch.randn(shape.k, shape.n, device="cuda", dtype=torch.float16))
        assert loaded.route(a, b) == (shape.m, shape.n, shape.k, shape.layout)
        got = torch.ops.evo.hgemm(a, b)
        torch.cuda.synchronize()
        ref = torch.matmul(a.float(), b.float())
        assert (got.float() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item() + 1e-2, shape
