"""bench/lora_merge_bench.py: bad arguments get one line and exit 2; a one-step run with the real
model writes the three models' seconds per step and the ratio."""
from __future__ import annotations

import json

import pytest

import bench_script
from operators import available_operators


def _bench():
    return bench_script.load("lora_merge_bench")


@pytest.mark.parametrize("argv", [["--rows", "x"], ["--rows", "0"], ["--tokens", "0"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    bench_script.refuses("lora_merge_bench", argv, capsys)


@pytest.mark.skipif("llm" not in available_operators(), reason="the llm extra is not installed")
def test_one_step_run_writes_every_model(tmp_path):
    pytest.importorskip("peft")
    out = tmp_path / "r.json"
    assert _bench().main(["--rows", "2", "--tokens", "2", "--repeats", "1", "--out", str(out)]) == 0
    fig = json.loads(out.read_text())["rows"]["2"]
    assert all(fig[k] > 0 for k in ("base", "merged", "unmerged"))
    assert fig["unmerged_over_merged"] == pytest.approx(fig["unmerged"] / fig["merged"])
    from operators.llm import load_backend

    assert load_backend().adapter == ""  # the shared backend is back on the base model
