"""bench/small_dev.py's variant lists (CPU: no GPU is touched by --list)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

small_dev = pytest.importorskip("small_dev")

from populations import Shape, load_templates  # noqa: E402


def test_variants_cover_every_applicable_template_and_tiny_past_its_rule() -> None:
    templates = load_templates()
    shape = Shape.parse("191x512x768")  # M and N > 128 and K past 384: tiny's applies rule refuses it
    labels = [lb for lb, _ in small_dev.variants(templates, shape, 16, 4)]
    assert not templates["tiny"].applicable(shape, 90)
    for name, t in templates.items():
        if t.applicable(shape, 90):
            assert f"{name}:pick0" in labels
    assert 16 <= sum(lb.startswith("tiny!:") for lb in labels) <= 16 + len(small_dev.tiny_focus(templates["tiny"], shape))
    assert "tiny!:16x8w8u2s1" in labels and "tiny!:16x8w8u2c4" in labels  # the focus: K whole, K over a cluster
    assert any(lb.startswith("sm80_mma:") and "pick" not in lb for lb in labels)


def test_tiny_grid_bounds_ctas_and_rounds() -> None:
    t = load_templates()["tiny"]
    shape = Shape.parse("121x374x139")
    grid = small_dev.tiny_grid(t, shape)
    assert grid and any(k["CLUSTER"] > 1 for k in grid)
    for k in grid:
        split = k["SPLIT_K"] * k["CLUSTER"]
        assert k["SPLIT_K"] == 1 or k["CLUSTER"] == 1
        ctas = -(-shape.m // k["TM"]) * -(-shape.n // k["TN"]) * split
        rounds = -(-(-(-shape.k // 16) // split) // (k["WARPS"] * k["KU"]))
        assert 66 <= ctas <= 1584 and rounds <= 2
        assert not t.check(k, shape, 90)


def test_list_runs_without_a_gpu() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "small_dev.py"), "--list", "--shapes", "80x401x201",
                          "2694x128x256"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("80x401x201:TN:f32:")


def test_wgmma_lean_grid_bounds_units_and_fits_the_width() -> None:
    t = load_templates()["sm90_wgmma"]
    shape = Shape.parse("11061x208x80")  # large M, short K, N <= 256: one column of tiles fits
    grid = small_dev.wgmma_lean(t, shape)
    assert grid and any(k["BN"] == 208 for k in grid) and any(not k["PERSISTENT"] for k in grid)
    for k in grid:
        units = -(-shape.m // k["BM"]) * -(-shape.n // k["BN"]) * k["SPLIT_K"]
        assert 33 <= units <= 528 and k["STAGES"] == 2  # K 80: two BK blocks, no deeper ring
        assert k["SPLIT_K"] == 1 or k["EPI"] == "direct"
        assert not t.check(k, shape, 90)
    labels = [lb for lb, _ in small_dev.variants(load_templates(), shape, 4, 2, wgmma_cap=5)]
    fitted = {small_dev.wgmma_label(k) for k in small_dev.wgmma_wave_fitted(t, shape)}
    output_bound = {small_dev.wgmma_label(k) for k in small_dev.wgmma_output_bound(t, shape)}
    clustered = [lb for lb in labels if lb.startswith("sm90_wgmma:") and re.search(r"c\d+x\d+$", lb)]
    lean = [lb for lb in labels if lb.startswith("sm90_wgmma:") and "pick" not in lb and lb not in clustered]
    assert fitted and fitted <= {lb.split(":", 1)[1] for lb in lean}  # every wave-fitted tile, beside the cap
    assert output_bound and any("pp" in lb for lb in lean)  # K 80: the output-bound set (a source once)
    assert 5 <= len(lean) <= 5 + len(fitted) + len(output_bound)
    assert 1 <= len(clustered) <= 10  # the thin clustered tiles, thinned to twice the cap


def test_output_bound_tiles_only_at_short_k_and_ping_pong_among_them() -> None:
    """K <= 256 (writing C is most of the work): persistent 128-row tiles, cooperative and
    ping-pong, every set valid; none where K is deep."""
    t = load_templates()["sm90_wgmma"]
    shape = Shape.parse("6693x11409x82")
    ks = small_dev.wgmma_output_bound(t, shape)
    assert {k["SCHED"] for k in ks} == {"coop", "pingpong"} and all(k["PERSISTENT"] and k["BM"] == 128 for k in ks)
    assert all(not t.check(k, shape, 90) for k in ks) and "pp" in small_dev.wgmma_label(ks[-1])
    assert small_dev.wgmma_output_bound(t, Shape.parse("6693x11409x1024")) == []


def test_thin_clustered_tiles_are_cublas_like_and_valid() -> None:
    """The thin tiles in 2- and 4-CTA clusters along either axis (cuBLAS's kernels on small mid rows):
    64 rows, one consumer, a 12-stage ring, widths 8-64, swapped and not, every set valid."""
    t = load_templates()["sm90_wgmma"]
    for text in ("115x1408x1280", "907x128x512", "56x3008x4224"):
        shape = Shape.parse(text)
        ks = small_dev.wgmma_thin_clusters(t, shape)
        assert any(k["CLUSTER_M"] == 4 for k in ks) and any(k["CLUSTER_N"] == 4 for k in ks), text
        assert any(k["SWAP"] for k in ks) and any(not k["SWAP"] for k in ks), text
        for k in ks:
            assert k["BM"] == 64 and k["STAGES"] == 12 and 8 <= k["BN"] <= 64 and not t.check(k, shape, 90)
            assert (k["CLUSTER_M"] == 1) != (k["CLUSTER_N"] == 1)


def test_wave_fitted_tiles_fill_one_or_two_waves_swapped_and_not() -> None:
    """The widths cut so the tiles fill 132 SMs once or twice (cuBLAS's 128x72, 128x104 on mid
    rows): each tile count within the waves it was cut for, widths 32-256 in steps of 8, swapped
    tiles cut from M, valid knob sets, one CTA a tile, K whole."""
    t = load_templates()["sm90_wgmma"]
    for text in ("1789x832x576", "1889x448x1664", "1724x744x896"):
        shape = Shape.parse(text)
        ks = small_dev.wgmma_wave_fitted(t, shape)
        assert any(k["SWAP"] for k in ks) and any(not k["SWAP"] for k in ks), text
        for k in ks:
            rows, cols = (shape.n, shape.m) if k["SWAP"] else (shape.m, shape.n)
            tiles = -(-rows // k["BM"]) * -(-cols // k["BN"])
            assert tiles <= 264 and 32 <= k["BN"] <= 256 and k["BN"] % 8 == 0, (text, k, tiles)
            assert (k["PERSISTENT"], k["SPLIT_K"], k["EPI"]) == (False, 1, "smem") and not t.check(k, shape, 90)
    assert any((k["BM"], k["BN"], k["SWAP"]) == (128, 96, False) for k in small_dev.wgmma_wave_fitted(
        t, Shape.parse("1789x832x576")))  # 14 rows of 128 x 9 columns of 96: 126 tiles, one wave
