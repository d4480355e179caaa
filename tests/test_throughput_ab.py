"""bench/throughput_ab.py: the same-machine A/B legs paired by shape and round, and their verdict."""
from __future__ import annotations

import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))

import throughput_ab  # noqa: E402


def _leg(root, name: str, shape: str, rate: float) -> None:
    os.makedirs(root / name)
    (root / name / "eval_bench.json").write_text(json.dumps({"date": "x", shape: {"per_minute": rate, "wall_s": 1.0}}))


def test_legs_pair_by_shape_and_round_and_the_geomean_decides(tmp_path, capsys) -> None:
    _leg(tmp_path, "ab_new_4096", "4096x4096x4096:TN:f32", 145.0)
    _leg(tmp_path, "ab_old_4096", "4096x4096x4096:TN:f32", 160.0)
    _leg(tmp_path, "ab_new_4096_2", "4096x4096x4096:TN:f32", 150.0)
    _leg(tmp_path, "ab_old_4096_2", "4096x4096x4096:TN:f32", 160.0)
    _leg(tmp_path, "ab_new_64", "64x128x64:TN:f32", 150.0)
    _leg(tmp_path, "ab_old_64", "64x128x64:TN:f32", 185.0)
    _leg(tmp_path, "ab_old_64_2", "64x128x64:TN:f32", 185.0)  # its new leg did not come back
    legs = throughput_ab.read_legs(str(tmp_path))
    assert legs[("4096", "2")] == {"new": 150.0, "old": 160.0} and legs[("64", "2")] == {"old": 185.0}
    _, res = throughput_ab.summarize(legs, 0.9)
    assert res["4096"]["ratios"] == [145 / 160, 150 / 160]
    assert math.isclose(res["4096"]["geomean"], math.sqrt(145 / 160 * 150 / 160)) and res["4096"]["verdict"] == "met"
    assert res["64"]["ratios"] == [150 / 185] and res["64"]["verdict"].startswith("missed by 0.08")
    assert throughput_ab.main([str(tmp_path), "--json", str(tmp_path / "s.json")]) == 0
    assert "did not come back" in capsys.readouterr().out
    assert json.loads((tmp_path / "s.json").read_text())["4096"]["verdict"] == "met"


def test_a_folder_without_legs_is_a_one_line_error(tmp_path, capsys) -> None:
    assert throughput_ab.main([str(tmp_path)]) == 2
    assert throughput_ab.main([str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("throughput_ab: ") for line in err)
