"""bench/gil_convoy_bench.py: bad arguments get one line and exit 2; a one-step run with the real
model writes every condition's step and held milliseconds and leaves the shared backend as it was."""
from __future__ import annotations

import json
import sys

import pytest

import bench_script
from operators import available_operators


def _bench():
    return bench_script.load("gil_convoy_bench")


@pytest.mark.parametrize("argv", [["--steps", "0"], ["--rounds", "-1"], ["--prompt-tokens", "0"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    bench_script.refuses("gil_convoy_bench", argv, capsys)


@pytest.mark.skipif("llm" not in available_operators(), reason="the llm extra is not installed")
def test_one_step_run_writes_every_condition(tmp_path):
    out = tmp_path / "g.json"
    before = sys.getswitchinterval()
    assert _bench().main(["--steps", "1", "--rounds", "1", "--prompt-tokens", "40", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 6 and {k.split(" | ")[0] for k in rows} == {"alone", "spin", "half"}
    assert all(0 < r["held_ms"] <= r["step_ms"] for r in rows.values())
    from operators.llm import load_backend
    from operators.llm._gil import HELD_SWITCH_INTERVAL_S

    assert not hasattr(load_backend(threads=1), "count_gpu_s") and HELD_SWITCH_INTERVAL_S == pytest.approx(1e-4)
    assert sys.getswitchinterval() == pytest.approx(before)
