"""The bandit over operators (issue 25): gain over the parent per GPU-second decides, the LLM's
inference GPU time is part of its cost, each adapter version is its own arm, and the engine
feeds it (evaluation GPU seconds, parent fitness, the LLM's GPU seconds) when [bandit] is on."""
from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from evo.search._config import ConfigError, merge
from evo.search._opbandit import BanditConfig, OperatorBandit, child_gain


def test_child_gain_is_improvement_over_the_parent_or_zero() -> None:
    assert child_gain(1.2, 1.0) == pytest.approx(math.log(1.2))
    assert child_gain(0.9, 1.0) == 0.0            # slower
    assert child_gain(None, 1.0) == 0.0           # invalid
    assert child_gain(1.5, None) == 0.0           # nothing to compare with
    assert child_gain(float("inf"), 1.0) == 0.0


def _shares(bandit: OperatorBandit, steps: int = 4000, seed: int = 0) -> Counter:
    rng = random.Random(seed)
    return Counter(bandit.order(rng)[0] for _ in range(steps))


def test_allocation_follows_gain_per_gpu_second() -> None:
    b = OperatorBandit({"knob": 1.0, "tpe": 1.0, "llm": 1.0}, BanditConfig(explore=0.0))
    for _ in range(200):
        b.observe("knob", 0.02, 0.1)    # 0.2 log-speedup per GPU-second
        b.observe("tpe", 0.005, 0.1)    # a quarter of that
        b.observe("llm", 0.0, 0.1)      # never improves
    got = _shares(b)
    assert got["knob"] > 0.9 * sum(got.values())
    assert b.rate("knob") > b.rate("tpe") > b.rate("llm")
    assert b.weights()["knob"] > 0.5


def test_the_llms_inference_time_is_its_cost() -> None:
    """Same children, same gains: the arm whose model also burnt GPU seconds loses."""
    b = OperatorBandit({"llm": 1.0, "knob": 1.0}, BanditConfig(explore=0.0))
    for _ in range(100):
        b.observe("llm", 0.01, 0.1)
        b.observe("knob", 0.01, 0.1)
        b.charge("llm", 0.5)           # the model's own GPU time per proposal
    assert b.summary()["llm"]["llm_gpu_s"] == pytest.approx(50.0)
    assert b.rate("knob") > 4 * b.rate("llm")
    got = _shares(b)
    assert got["knob"] > 0.95 * sum(got.values())


def test_a_weak_operator_costs_little_but_is_still_explored() -> None:
    b = OperatorBandit({"knob": 1.0, "llm": 1.0}, BanditConfig(explore=0.1))
    for _ in range(300):
        b.observe("knob", 0.02, 0.1)
        b.observe("llm", 0.0, 0.1)
    got = _shares(b, 5000)
    assert 0.02 < got["llm"] / 5000 < 0.1  # about half the exploration share, nothing more


def test_an_untried_arm_gets_tried() -> None:
    b = OperatorBandit({"knob": 1.0, "llm": 1.0}, BanditConfig(explore=0.0))
    for _ in range(5):
        b.observe("knob", 0.0, 0.2)  # one GPU-second without gain
    got = _shares(b, 2000)
    assert got["llm"] > got["knob"]  # the prior is wider than a record of nothing


def test_each_adapter_version_is_its_own_arm() -> None:
    b = OperatorBandit({"llm": 1.0, "knob": 1.0}, BanditConfig(explore=0.0))
    for _ in range(200):
        b.observe("llm", 0.0, 0.1, version="")  # the base model: no gain
        b.observe("knob", 0.005, 0.1)
    base_rate = b.rate("llm")
    b.observe("llm", 0.05, 0.1, version="v1-abc")  # the first child of the adapter
    assert b.arm("llm") == "llm@v1-abc"
    assert b.rate("llm") > 10 * base_rate  # a fresh record, not the base model's
    s = b.summary()
    assert s["llm"]["children"] == 200 and s["llm@v1-abc"]["children"] == 1
    assert b.arm("llm", "") == "llm"


def test_config_section_and_validation() -> None:
    cfg = merge({"shapes": ["64x64x64"], "archive": "x", "bandit": {"enabled": True, "explore": 0.2}}, {})
    assert cfg.bandit.enabled and cfg.bandit.explore == 0.2
    with pytest.raises(ConfigError):
        merge({"shapes": ["64x64x64"], "archive": "x", "bandit": {"enabled": "yes"}}, {})
    with pytest.raises(ValueError):
        OperatorBandit({"knob": 1.0}, BanditConfig(explore=2.0))


def test_the_engine_feeds_the_bandit_and_charges_the_llms_gpu_seconds(tmp_path) -> None:
    from evo.cli._orchestrate import expand_operators, make_operators
    from evo.search._engine import Engine
    from evo.search._opbandit import OperatorBandit
    from evo.search._progress import EVENTS_FILE, EventLog, read_events
    from fake_pool import FakeEvaluatorPool
    from operators import ModelOperator, get_operator
    from populations import Archive, load_templates

    class ModelOnGpuDouble(ModelOperator):
        """Knob mutation standing in for an LLM operator whose model spends 0.25 GPU-s a call
        (the GPU is the boundary here): only the accounting hook matters."""

        arity = 1
        name = "llm"

        def __init__(self) -> None:
            self.inner = get_operator("knob_mutation")
            self.calls = 0

        def _propose(self, parents, shape, rng, n, context):  # type: ignore[no-untyped-def]
            self.calls += 1
            return self.inner.propose(parents, shape, rng, n, context)

        def take_gpu_seconds(self) -> float:
            return 0.25

        def take_gpu_wait_seconds(self) -> float:  # waits for the lease: reported, never charged
            return 0.75

    cfg = merge({}, {"shapes": ["256x256x256"], "archive": str(tmp_path / "a"), "operators": "knob_mutation,llm",
                     "progress": "none", "max_evals": 60,
                     # uniform order every step: this test is about the accounting, and under Thompson
                     # draws alone the cheap knob arm could take all 60 evaluations (a CI run saw it)
                     "bandit": {"enabled": True, "explore": 1.0}})
    ops = make_operators({"knob_mutation": 1.0})
    ops["llm"] = ModelOnGpuDouble()
    pool = FakeEvaluatorPool(delay_s=0.0)
    with Archive(cfg.archive, "w") as archive:
        events = EventLog(cfg.archive / EVENTS_FILE)
        engine = Engine(cfg, archive, pool, ops, load_templates(), events=events)
        result = engine.run()
        events.close()
    pool.close()
    assert isinstance(engine.chooser, OperatorBandit)
    stop = [e for e in read_events(cfg.archive / EVENTS_FILE) if e["event"] == "stop"][-1]
    arms = stop["bandit"]
    assert arms["knob_mutation"]["children"] > 0 and arms["knob_mutation"]["gpu_s"] > 0
    calls = ops["llm"].calls
    assert calls >= 3 and arms["llm"]["llm_gpu_s"] == pytest.approx(0.25 * calls)
    assert result.budget["llm_gpu_s"] == pytest.approx(0.25 * calls)
    assert result.budget["gpu_s"] >= result.budget["llm_gpu_s"]
    assert result.budget["llm_gpu_wait_s"] == pytest.approx(0.75 * calls)  # reported beside, not in gpu_s
