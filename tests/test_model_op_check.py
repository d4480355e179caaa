"""CPU tests of bench/model_op_check.py's pure parts: the shape order under a time cap and the
summary per export path (the GPU timing itself runs on the device)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import model_op_check as moc  # noqa: E402
import seed_bench  # noqa: E402


def test_order_is_round_robin_over_flop_decades_smallest_first() -> None:
    keys = [(4096, 4096, 4096, "TN"), (64, 64, 64, "TN"), (1, 4096, 4096, "TN"), (16, 16, 16, "TN"),
            (8, 128, 128, "TN"), (1, 128, 128, "TN")]
    order = moc._order(keys)
    assert sorted(order) == sorted(keys)
    # one shape of each decade before any decade's second one: a cap drops some of every size
    assert order[:5] == [(16, 16, 16, "TN"), (1, 128, 128, "TN"), (8, 128, 128, "TN"), (1, 4096, 4096, "TN"),
                         (4096, 4096, 4096, "TN")]
    assert order[5] == (64, 64, 64, "TN")


def _row(path: str, linear: float, fallback: float) -> dict:
    return {"default_path": (path, ""), "offline_vs_matmul": {"op_linear": linear, "op_fallback": fallback},
            "pipelined_vs_matmul": {"op_linear": linear * 1.1, "op_fallback": fallback}}


def test_summary_judges_each_path_by_the_call_a_user_gets() -> None:
    s = moc.summarize([_row("evolved", 1.5, 0.9), _row("evolved", 0.96, 0.9), _row("cublas", 0.7, 0.98)])
    ev, cb = s["evolved"], s["cublas"]
    assert ev["arm"] == "op_linear" and ev["offline"]["n"] == 2
    assert ev["offline"]["geomean"] == pytest.approx((1.5 * 0.96) ** 0.5) and ev["offline"]["min"] == 0.96
    assert ev["offline"]["at_least_1"] == 1
    assert cb["arm"] == "op_fallback" and cb["offline"]["geomean"] == pytest.approx(0.98)
    assert cb["op_linear_offline"]["min"] == 0.7  # the slower kept kernel is shown, not judged


def test_stratified_takes_every_shape_when_asked_for_as_many(tmp_path: Path) -> None:
    grid = tmp_path / "g.csv"
    grid.write_text("M,N,K\n" + "".join(f"{m},{n},64\n" for m in (1, 8, 64, 512) for n in (64, 4096, 50257)))
    shapes = seed_bench.read_grid(grid)
    assert sorted(seed_bench.stratified(shapes, len(shapes), 3), key=str) == sorted(shapes, key=str)
    assert sorted(seed_bench.stratified(shapes, len(shapes) + 5, 3), key=str) == sorted(shapes, key=str)
