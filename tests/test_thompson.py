"""One bandit core (issue 37): ``operators.ThompsonRates``, the Gamma-Poisson Thompson sampler both
the LLM's model choice and the engine's operator choice stand on."""
from __future__ import annotations

import random
import statistics

import pytest

from operators import ThompsonRates
from operators.llm import ModelBandit


def test_posterior_mean_and_draws_follow_reward_per_cost() -> None:
    t = ThompsonRates(prior_reward=1.0, prior_cost=2.0)
    t.add("a", reward=9.0, cost=8.0)
    t.add("b", cost=30.0)
    t.add("b", reward=-5.0, cost=-1.0)  # negative amounts count as nothing
    assert t.mean("a") == pytest.approx(10.0 / 10.0) and t.mean("b") == pytest.approx(1.0 / 32.0)
    assert t.mean("untried") == pytest.approx(0.5)
    rng = random.Random(3)
    draws = [t.draw("a", rng) for _ in range(4000)]
    assert statistics.mean(draws) == pytest.approx(1.0, rel=0.06)
    wins = sum(max(("a", "b"), key=t.draws(["a", "b"], rng).__getitem__) == "a" for _ in range(500))
    assert wins > 480  # the arm with the better rate is nearly always drawn first


def test_bad_priors_are_refused() -> None:
    with pytest.raises(ValueError):
        ThompsonRates(0.0, 1.0)
    with pytest.raises(ValueError):
        ThompsonRates(1.0, -1.0)


def test_both_bandits_stand_on_the_core() -> None:
    from evo.search._opbandit import BanditConfig, OperatorBandit

    m = ModelBandit(["x", "y"], prices={"y": 2.0})
    m.spend("y", 3000)
    m.reward("y", 2)
    assert isinstance(m._rates, ThompsonRates)
    assert m.rate("y") == pytest.approx((1 + 2) / (1 + 2.0 * 3.0)) == pytest.approx(m._rates.mean("y"))
    o = OperatorBandit({"knob": 1.0, "llm": 1.0}, BanditConfig(enabled=True))
    o.observe("llm", gain=0.05, gpu_s=4.0, version="")
    o.charge("llm", 6.0)
    assert isinstance(o.rates, ThompsonRates)
    assert o.rate("llm") == pytest.approx((1 + 5) * 0.01 / (2 + 10.0))
    assert o.summary()["llm"]["rate_per_gpu_s"] == pytest.approx(round(o.rate("llm"), 6))
