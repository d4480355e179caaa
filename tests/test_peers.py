"""The peers benchmark (bench/peers_bench.py) on the CPU: everything but the GPU measurements.

A fixture CSV with hand-chosen times checks the summary statistics, FLOP-decade binning and the
exclusion of kernels that failed their fresh-input check; the plots and the CUDA-L2 published
join are written and read back; bad arguments exit 2 with one clear line; shape selection from
a real fixture archive and the grid; the export-failure fallback compiles with the real
compiler; our Triton kernel runs under Triton's CPU interpreter against an fp32 reference.
"""
from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import _peers_stats as st  # noqa: E402
import peers_bench  # noqa: E402
from archive_fixture import S_F16, S_FAIL, S_MMA, S_NN, S_TINY, S_WGMMA, build  # noqa: E402
from populations import Shape  # noqa: E402

REAL_ANCHORS = ROOT.parent / "shared" / "anchors" / "cuda-l2"


def row(m: int, n: int, k: int, times: dict[str, float], check: str = "pass", layout: str = "TN") -> dict:
    """A CSV row: ``times`` maps arm -> microseconds, the same in every timer unless the key says
    ``timer:arm``."""
    s = Shape(m, n, k, layout)
    r = {"shape": str(s), "M": m, "N": n, "K": k, "layout": layout, "flops": s.flops, "decade": st.decade(s.flops),
         "candidate": "c" + str(m), "template": "tiny", "evolved_path": "export", "evolved_check": check}
    if not any(key.endswith("evolved") for key in times):
        r.update(candidate="", template="", evolved_path="none: no ok, unflagged kernel", evolved_check="")
    for key, us in times.items():
        timers, arm = ([key.split(":")[0]], key.split(":")[1]) if ":" in key else (st.TIMERS, key)
        for t in timers:
            r[f"{t}_{arm}_us"] = us
    return r


# evolved vs torch (best of nn/tn) in the device timer: 2.0, 0.5, 1.25, 4.0 (failed: excluded)
ROWS = [
    row(64, 64, 64, {"evolved": 5.0, "torch_nn": 10.0, "torch_tn": 12.0, "lt_heuristic": 8.0, "lt_autotuned": 7.5,
                     "triton": 20.0, "offline:evolved_op": 9.0}),                                 # 5.2e5 -> 1e5
    row(64, 64, 128, {"evolved": 20.0, "torch_nn": 11.0, "torch_tn": 10.0, "triton": 30.0}),       # 1.0e6 -> 1e6
    row(1024, 1024, 1024, {"evolved": 80.0, "torch_nn": 100.0, "torch_tn": 150.0, "lt_heuristic": 90.0,
                           "lt_autotuned": 120.0}),                                                # 2.1e9 -> 1e9
    row(64, 64, 256, {"evolved": 2.0, "torch_nn": 8.0, "torch_tn": 9.0}, check="fail: 3 outputs outside tolerance"),
    row(128, 128, 128, {"torch_nn": 7.0, "torch_tn": 6.0, "triton": 6.0}),                        # no evolved kernel
]


def test_decade_binning() -> None:
    assert st.decade(2 * 64 ** 3) == "1e5" and st.decade(10 ** 9) == "1e9" and st.decade(10 ** 9 - 1) == "1e8"
    assert st.decade(2 * 16384 ** 3) == "1e12" and st.decade(1) == "1e0"
    with pytest.raises(ValueError):
        st.decade(0)
    grid = [Shape(m, n, k) for m in (64, 1000, 12288) for n in (64, 16384) for k in (64, 125, 8192)]
    for s in grid:  # every shape lands in the decade whose bounds hold its FLOPs (2*1000*64*125 = 1.6e7 exactly)
        d = int(st.decade(s.flops)[2:])
        assert 10 ** d <= s.flops < 10 ** (d + 1)


def test_summary_statistics(tmp_path: Path) -> None:
    st.write_rows(tmp_path / "peers.csv", ROWS)
    rows = st.read_rows(tmp_path / "peers.csv")
    assert [r["device_evolved_vs_torch"] for r in rows] == ["2.0", "0.5", "1.25", "", ""]  # failed check: no speedup
    s = st.summarize(rows)
    assert s["shapes"] == 5 and s["with_evolved"] == 4 and s["evolved_checked_ok"] == 3
    assert s["evolved_failed"] == ["64x64x256:TN:f32"] and s["paths"] == {"export": 4, "none": 1}
    head = s["timers"]["device"]["evolved vs torch"]
    assert head["n"] == 3
    assert head["mean"] == pytest.approx((2.0 + 0.5 + 1.25) / 3)
    assert head["geomean"] == pytest.approx((2.0 * 0.5 * 1.25) ** (1 / 3))
    assert head["median"] == pytest.approx(1.25) and head["min"] == pytest.approx(0.5) and head["max"] == 2.0
    assert head["wins"] == pytest.approx(2 / 3)
    assert set(head["per_decade"]) == {"1e5", "1e6", "1e9"}
    assert head["per_decade"]["1e6"] == {"n": 1, "mean": 0.5, "geomean": pytest.approx(0.5), "median": 0.5,
                                         "min": 0.5, "max": 0.5, "wins": 0.0}
    assert s["decades"] == ["1e5", "1e6", "1e9"]  # 64x64x256 (2.1e6) and 128^3 (4.2e6) are in 1e6 too
    # best peer = fastest of torch, both cuBLASLt arms and Triton: 7.5, 10, 90 -> 1.5, 0.5, 1.125
    bp = s["timers"]["device"]["evolved vs best_peer"]
    assert bp["n"] == 3 and bp["geomean"] == pytest.approx((1.5 * 0.5 * 1.125) ** (1 / 3))
    assert s["timers"]["device"]["lt_autotuned vs torch"]["n"] == 2
    assert s["timers"]["device"]["triton vs torch"]["min"] == pytest.approx(10.0 / 30.0)
    assert "evolved_op vs torch" in s["timers"]["offline"] and "evolved_op vs torch" not in s["timers"]["device"]
    assert s["timers"]["offline"]["evolved_op vs torch"]["geomean"] == pytest.approx(10.0 / 9.0)
    assert s["compass"]["met"] is False and s["compass"]["decades_below_1"] == ["1e6"]


def test_summary_markdown_and_plots(tmp_path: Path) -> None:
    s = st.write_summary(tmp_path, ROWS, {"gpu": "test"}, None)
    files = sorted(os.listdir(tmp_path))
    assert files == sorted(["summary.md", "summary.json", *st.PLOTS])
    for png in st.PLOTS:
        data = (tmp_path / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, png
    md = (tmp_path / "summary.md").read_text()
    assert "## device timer" in md and "## offline timer" in md and "## server timer" in md
    assert "| evolved vs torch | 3 |" in md and "compass" in md and "**not met**" in md
    assert "failed the fresh-input check" in md and "64x64x256:TN:f32" in md
    assert "CUDA-L2 join: not made here" in md
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["summary"]["timers"]["device"]["evolved vs torch"]["geomean"] == pytest.approx(s["timers"]["device"]["evolved vs torch"]["geomean"])


def _anchors(tmp_path: Path) -> Path:
    """CUDA-L2's file format (header and a few rows copied in form, values made up)."""
    d = tmp_path / "anchors" / "eval_results"
    d.mkdir(parents=True)
    head = ("mnk,torch.matmul,cuBLAS-tn,cuBLAS-nn,cuBLAS-max,cuBLASLt-heuristic-tn,cuBLASLt-heuristic-nn,"
            "cuBLASLt-heuristic-max,cuBLASLt-auto-tuning-tn,cuBLASLt-auto-tuning-nn,cuBLASLt-auto-tuning-max\n")
    for mode, base in (("offline", 1.8), ("server", 1.4)):
        (d / f"cuda_l2_h100_F32F16F16F32_speedup_{mode}.csv").write_text(
            head + f"64_64_64,{base},1,1,1,1,1,{base - 0.1},1,1,{base - 0.5}\n"
                   f"1024_1024_1024,1.1,1,1,1,1,1,1.05,1,1,0.95\n"
                   f"64_64_256,1.3,1,1,1,1,1,1.2,1,1,1.1\n")
    return tmp_path / "anchors"


def test_cuda_l2_published_join(tmp_path: Path) -> None:
    rows = [st.with_speedups(r) for r in ROWS] + [st.with_speedups(row(64, 64, 64, {"evolved": 1.0, "torch_nn": 2.0},
                                                                       layout="NN"))]
    join = st.cuda_l2_join(rows, _anchors(tmp_path))
    by = {r["shape"]: r for r in join["rows"]}
    assert set(by) == {"64x64x64:TN:f32", "1024x1024x1024:TN:f32", "64x64x256:TN:f32"}  # NN and 128^3 not shared
    r = by["64x64x64:TN:f32"]
    assert r["offline_cuda_l2_vs_torch_h100_published"] == 1.8 and r["server_cuda_l2_vs_torch_h100_published"] == 1.4
    assert r["offline_cuda_l2_vs_lt_autotuned_h100_published"] == pytest.approx(1.3)
    assert r["offline_evo_vs_torch_measured"] == 2.0 and r["offline_evo_vs_lt_autotuned_measured"] == 1.5
    assert by["64x64x256:TN:f32"]["offline_evo_vs_torch_measured"] == ""  # failed check: only the published side
    stats = join["stats"]["offline vs torch"]
    assert stats["n"] == 2 and stats["cuda_l2_geomean"] == pytest.approx(math.sqrt(1.8 * 1.1))
    out = tmp_path / "out"
    out.mkdir()
    st.write_summary(out, ROWS, {}, _anchors(tmp_path / "again"))
    md = (out / "summary.md").read_text()
    assert "## CUDA-L2 (published, not re-measured)" in md and "| offline vs torch | 2 |" in md
    with open(out / "cuda_l2_published.csv", newline="") as fh:
        got = list(csv.DictReader(fh))
    assert len(got) == 3 and "offline_cuda_l2_vs_torch_h100_published" in got[0]


@pytest.mark.skipif(not REAL_ANCHORS.is_dir(), reason="CUDA-L2 anchors (../shared/anchors/cuda-l2) are not here")
def test_join_with_the_real_published_files() -> None:
    rows = [st.with_speedups(row(m, m, m, {"evolved": 1.0, "torch_nn": 1.0, "torch_tn": 1.0}))
            for m in (64, 4096, 16384)]
    join = st.cuda_l2_join(rows, REAL_ANCHORS)
    assert len(join["rows"]) == 3
    assert join["rows"][0]["offline_cuda_l2_vs_torch_h100_published"] == pytest.approx(1.837)  # 64_64_64 row


def test_summarize_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st.write_rows(tmp_path / "peers.csv", ROWS)
    out = tmp_path / "s"
    assert peers_bench.main(["--summarize", str(tmp_path / "peers.csv"), "--out", str(out),
                             "--cuda-l2", str(_anchors(tmp_path))]) == 0
    assert len(os.listdir(out)) <= 7 and (out / "cuda_l2_published.csv").is_file()
    assert "# evo vs peers" in capsys.readouterr().out


def _with_archived(r: dict, evolved: float, seed: float | None) -> dict:
    return {**r, "archived_device_speedup": evolved, **({} if seed is None else {"seed_archived_device_speedup": seed})}


def test_evolved_vs_seed_per_decade(tmp_path: Path) -> None:
    """The archived evolved/seed figures: per-shape gains, geomeans per decade, the decade table."""
    rows = [_with_archived(ROWS[0], 1.2, 1.0), _with_archived(ROWS[1], 0.9, 1.0), _with_archived(ROWS[2], 1.1, 0.55),
            _with_archived(ROWS[3], 3.0, None), ROWS[4]]  # no seed figure / no evolved kernel: left out
    st.write_rows(tmp_path / "peers.csv", rows)
    s = st.summarize(st.read_rows(tmp_path / "peers.csv"))
    g = s["seed_vs_evolved"]
    assert g["n"] == 3 and g["improved"] == pytest.approx(2 / 3)
    assert g["gain_geomean"] == pytest.approx((1.2 * 0.9 * 2.0) ** (1 / 3))
    assert g["seed_geomean"] == pytest.approx((1.0 * 1.0 * 0.55) ** (1 / 3))
    assert set(g["per_decade"]) == {"1e5", "1e6", "1e9"} and g["per_decade"]["1e6"]["gain_geomean"] == pytest.approx(0.9)
    md = st.markdown(s)
    table = md.split("## Per FLOP decade")[1].split("## device timer")[0]
    assert "| evolved / seed | improved |" in table
    assert "| 1e6 | 1 | 0.500x | 0.500x | 0% | 0.500x |" in table  # device vs torch, min, wins, vs best peer
    assert "| 1.000x | 0.900x | 0.900x | 0% of 1 |" in table
    assert "| **all** | 3 | " in table and f"| {(1.2 * 0.9 * 2.0) ** (1 / 3):.3f}x | 67% of 3 |" in table
    assert "seed (archived)" not in st.markdown(st.summarize(ROWS))  # no seed figures: no seed columns


def test_summarize_with_a_seed_archive(tmp_path: Path) -> None:
    build(tmp_path / "seeds")  # best archived: 64x64x64 1.31x (tiny), 128x256x64 1.08x (the flagged one excluded)
    rows = [_with_archived(row(S_TINY.m, S_TINY.n, S_TINY.k, {"evolved": 5.0, "torch_nn": 10.0, "torch_tn": 10.0}),
                           1.5, None),
            _with_archived(row(S_MMA.m, S_MMA.n, S_MMA.k, {"evolved": 5.0, "torch_nn": 10.0, "torch_tn": 10.0}),
                           1.08, None)]
    st.write_rows(tmp_path / "peers.csv", rows)
    assert peers_bench.main(["--summarize", str(tmp_path / "peers.csv"), "--out", str(tmp_path / "o"),
                             "--seed-archive", str(tmp_path / "seeds")]) == 0
    data = json.loads((tmp_path / "o" / "summary.json").read_text())
    g = data["summary"]["seed_vs_evolved"]
    assert g["n"] == 2 and g["seed_geomean"] == pytest.approx((1.31 * 1.08) ** 0.5, rel=1e-3)
    assert g["improved"] == pytest.approx(0.5)  # 1.5 > 1.31; 1.08 is not above 1.08
    assert "seeds: archive" in (tmp_path / "o" / "summary.md").read_text()


def test_seed_bench_sample_order_and_list(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The device plan's shape list (--list) and the interleaved order that reaches the largest shapes."""
    import seed_bench

    monkeypatch.setattr(sys, "argv", ["seed_bench.py", "--list", "--n", "100"])
    assert seed_bench.main() == 0
    listed = [Shape.parse(x) for x in capsys.readouterr().out.split()]
    sample = seed_bench.stratified(seed_bench.read_grid(None), 100, 3)
    assert listed == sample and len(set(listed)) == 100
    order = seed_bench.interleave(sample)
    assert sorted(order, key=str) == sorted(sample, key=str)
    assert order[0] == max(sample, key=lambda s: s.flops)
    assert len({st.decade(s.flops) for s in order[:8]}) == 8  # one of every decade before any second
    largest = sorted(sample, key=lambda s: s.flops)[-8:]
    assert max(order.index(s) for s in largest) < 70  # the 8 largest are not left for the end


def _err(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    try:
        code = peers_bench.main(argv)
    except SystemExit as exc:  # argparse
        code = exc.code
    assert code == 2, argv
    err = capsys.readouterr().err.strip().splitlines()
    assert err, argv
    return err[-1]


@pytest.mark.parametrize("case,expect", [
    ("nothing", "no shapes"), ("both", "not both"), ("no_source", "--archive DIR or --library DIR"),
    ("from_archive_alone", "--from-archive needs"), ("no_out", "--out DIR is required"),
    ("bad_shape", "--shapes:"), ("missing_archive", "cannot open the archive"), ("not_archive", "cannot open the archive"),
    ("not_library", "not an evo export"), ("missing_csv", "no such file"), ("not_csv", "not a peers CSV"),
    ("out_is_file", "is not a directory"), ("negative", "must be >= 0"), ("bad_anchors", "no eval_results"),
    ("shapes_file", "not found"), ("bad_grid", "grid file"), ("bad_seed_archive", "--seed-archive"),
])
def test_argument_errors(case: str, expect: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arch = tmp_path / "arch"
    (tmp_path / "plain").mkdir()
    (tmp_path / "file").write_text("x")
    (tmp_path / "other.csv").write_text("a,b\n1,2\n")
    out = ["--out", str(tmp_path / "o")]
    argv = {
        "nothing": ["--archive", str(arch), *out],
        "both": ["--archive", str(arch), "--library", str(arch), "--shapes", "64x64x64", *out],
        "no_source": ["--shapes", "64x64x64", *out],
        "from_archive_alone": ["--from-archive", "--list-shapes"],
        "no_out": ["--archive", str(arch), "--shapes", "64x64x64"],
        "bad_shape": ["--archive", str(arch), "--shapes", "64x64", *out],
        "missing_archive": ["--archive", str(tmp_path / "nope"), "--from-archive", *out],
        "not_archive": ["--archive", str(tmp_path / "plain"), "--from-archive", *out],
        "not_library": ["--library", str(tmp_path / "plain"), "--from-archive", *out],
        "missing_csv": ["--summarize", str(tmp_path / "none.csv"), *out],
        "not_csv": ["--summarize", str(tmp_path / "other.csv"), *out],
        "out_is_file": ["--summarize", str(tmp_path / "peers.csv"), "--out", str(tmp_path / "file")],
        "negative": ["--archive", str(arch), "--shapes", "64x64x64", "--max-seconds", "-1", *out],
        "bad_anchors": ["--summarize", str(tmp_path / "peers.csv"), "--cuda-l2", str(tmp_path / "plain"), *out],
        "shapes_file": ["--archive", str(arch), "--shapes-file", str(tmp_path / "none.txt"), *out],
        "bad_grid": ["--archive", str(arch), "--grid-sample", "5", "--grid", str(tmp_path / "none.csv"), *out],
        "bad_seed_archive": ["--summarize", str(tmp_path / "peers.csv"), "--seed-archive", str(tmp_path / "plain"), *out],
    }[case]
    st.write_rows(tmp_path / "peers.csv", ROWS)
    assert expect in _err(argv, capsys)
    assert not (tmp_path / "o").exists()  # nothing written on bad input


def test_shape_selection(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    build(tmp_path / "arch")
    (tmp_path / "shapes.txt").write_text("# comment\n64x64x64\n2048x64x64:NN\n")
    (tmp_path / "grid.csv").write_text("M,N,K\n64,128,96\n")  # K 96: not a grid shape
    assert peers_bench.main(["--archive", str(tmp_path / "arch"), "--from-archive", "--shapes", "8x8x8,64x64x64",
                             "--shapes-file", str(tmp_path / "shapes.txt"), "--list-shapes"]) == 0
    cap = capsys.readouterr()
    got = cap.out.split()
    # union in order, no repeats; the failure-only and the f16 shapes are not benchmarked
    assert got == ["8x8x8:TN:f32", "64x64x64:TN:f32", "2048x64x64:NN:f32",
                   *[str(s) for s in (S_MMA, S_NN, S_WGMMA)]]
    assert str(S_FAIL) not in got and str(S_F16) not in got and "f16" in cap.err
    assert f"1 archived shape(s) without an ok, unflagged kernel left out: {S_FAIL}" in cap.err
    assert peers_bench.main(["--shapes-file", str(tmp_path / "grid.csv"), "--grid-sample", "100", "--list-shapes"]) == 0
    grid = [Shape.parse(s) for s in capsys.readouterr().out.split()]
    assert grid[0] == Shape(64, 128, 96) and len(grid) == 101 and len(set(grid)) == 101
    decades = [st.decade(s.flops) for s in grid[1:]]
    assert len(set(decades)) == 8  # 1e5 .. 1e12: every FLOP decade of the grid is represented
    order = peers_bench.interleave(grid[1:], 3)
    assert sorted(map(str, order)) == sorted(map(str, grid[1:]))
    first = [st.decade(s.flops) for s in order[:8]]
    assert len(set(first)) == 8  # a run cut after 8 shapes still has one of every decade


def test_export_failure_falls_back_to_the_evaluator_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """evo export fails (no nvcc): every shape is compiled for the evaluator's launch path, with the
    reason in its path; a shape without a kernel says so."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="NVRTC (cuda-python) is not installed")
    import evo.export._export
    from _peers_evolved import Evolved

    build(tmp_path / "arch")
    monkeypatch.setattr(evo.export._export, "NVCC", str(tmp_path / "no-nvcc"))
    logs: list[str] = []
    ev = Evolved(tmp_path / "arch", None, tmp_path / "work", "sm_90a", logs.append)
    ev.prepare([S_TINY, S_WGMMA, S_FAIL])
    assert ev.library_path is None and "export failed" in ev.export_note and not (tmp_path / "work" / "lib").exists()
    assert set(ev.cubins) == {S_TINY, S_WGMMA}
    assert ev.compile_notes[S_TINY].startswith("evaluator: export failed: nvcc failed to run")
    assert ev.compile_notes[S_FAIL].startswith("none: no ok, unflagged kernel")
    kernel, why = ev.kernel(S_FAIL)
    assert kernel is None and why.startswith("none:")
    assert any("evo export failed" in m for m in logs)


TRITON_CHECK = r"""
import sys, torch
sys.path.insert(0, sys.argv[1])
import _peers_triton as T
torch.manual_seed(0)
worst = 0.0
for m, n, k, layout in [(64, 128, 96, "TN"), (40, 72, 64, "NN"), (64, 64, 256, "TN")]:
    a = torch.rand(m, k).half() * 2 - 1
    b = (torch.rand(n, k) if layout == "TN" else torch.rand(k, n)).half() * 2 - 1
    b_kn = b.t() if layout == "TN" else b
    ref = a.float() @ b_kn.float()
    for cfg in (T.CONFIGS[5], T.CONFIGS[-1]):
        c = torch.full((m, n), float("nan")).half()
        T.launcher(cfg, a, b_kn, c)()
        assert not torch.isnan(c).any(), (m, n, k, cfg)
        worst = max(worst, ((c.float() - ref).abs().max() / ref.abs().max()).item())
print(worst)
"""


def test_triton_kernel_under_the_interpreter() -> None:
    """Our Triton matmul (TN, NN, ragged M/N/K) against fp32 on the CPU through TRITON_INTERPRET=1."""
    pytest.importorskip("triton", reason="triton is not installed")
    out = subprocess.run([sys.executable, "-c", TRITON_CHECK, str(ROOT / "bench")], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.split()[-1]) < 2e-3  # fp16 output rounding of an fp32 accumulation


WATCHDOG = r"""
import sys, time, argparse
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import peers_bench
from populations import Shape
out = Path(sys.argv[2])
out.mkdir()
args = argparse.Namespace(shape_timeout=1.0, max_seconds=0.0, out=out)
rows = [dict(r) for r in ROWS]
current = {"shape": Shape(512, 512, 512), "since": time.monotonic()}
peers_bench.Watchdog(args, rows, {"gpu": "test"}, None, current, time.monotonic(), [Shape(512, 512, 512)])
time.sleep(30)  # a kernel that never finishes
sys.exit(0)
"""


def test_watchdog_writes_the_summary_of_a_stuck_run(tmp_path: Path) -> None:
    """A shape that never finishes: the watchdog writes what was measured and exits 1 within seconds."""
    code = "ROWS = " + repr(ROWS) + "\n" + WATCHDOG
    out = subprocess.run([sys.executable, "-c", code, str(ROOT / "bench"), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "ran longer than --shape-timeout" in out.stderr
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "stopped by the watchdog" in md and "512x512x512:TN:f32" in md and "| evolved vs torch | 3 |" in md
