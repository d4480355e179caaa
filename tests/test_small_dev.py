"""bench/small_dev.py's variant lists (CPU: no GPU is touched by --list)."""
from __future__ import annotations

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
    assert sum(lb.startswith("sm90_wgmma:") and "pick" not in lb for lb in labels) == 5
