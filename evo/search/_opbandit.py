"""A bandit over operators: proposals go where improvement per GPU-second is (issue 25).

Every operator is an arm, and an LLM operator is one arm per adapter version it answers with
(``llm`` for the base model, ``llm@v2-...`` once an RL update switched it), so a new adapter
starts from the prior instead of inheriting the base model's record. An arm's *cost* is the GPU
seconds it caused: its children's evaluations (correctness + timing, failures included) plus,
for LLM operators, the model's own GPU seconds (inference on a GPU; nothing for a model on the
CPU). Its *gain* is the sum over its children of ``max(0, log(child speedup / parent speedup))``
at the shape: the improvement over the parent in GPU time, zero for an invalid or slower child
(a proposal without parents, e.g. an Optuna sample, is compared with the shape's best before it).

Allocation is Thompson sampling on a Gamma-Poisson model of gain per GPU-second
(:class:`operators.ThompsonRates`, the core the LLM's model bandit uses too): gain counted in
units of ``unit`` (1% of log speedup), an arm's posterior is Gamma(``prior_gain`` + gain/unit,
``prior_cost_s`` + cost). Each step draws one rate per arm and orders the operators by it; with
probability ``explore`` the order is uniform instead, so a weak arm keeps being looked at (the
run is not stationary: a parent pool that improves changes every arm's odds). A weak operator
therefore costs little: it is asked in proportion to the chance that it is the best one.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from operators import ThompsonRates

from ._chooser import OperatorChooser

__all__ = ["BanditConfig", "OperatorBandit", "child_gain"]


@dataclass
class BanditConfig:
    """``[bandit]`` in the run's TOML (``evo run --operator-bandit`` sets ``enabled``)."""

    enabled: bool = False
    explore: float = 0.05      # share of steps that order the operators uniformly
    prior_gain: float = 1.0    # prior pseudo-gain, in units
    prior_cost_s: float = 2.0  # prior pseudo-cost, GPU seconds
    unit: float = 0.01         # one unit of gain: 1% of log speedup


def child_gain(child_fitness: Optional[float], parent_fitness: Optional[float]) -> float:
    """``max(0, log(child / parent))`` of two speedups: 0 for an invalid child or one no faster;
    a valid child of a parent without a valid measurement gains nothing either (nothing to
    compare with: the fix prompt's children are valid, not faster)."""
    if child_fitness is None or parent_fitness is None or not child_fitness > 0 or not parent_fitness > 0:
        return 0.0
    if not (math.isfinite(child_fitness) and math.isfinite(parent_fitness)):
        return 0.0
    return max(0.0, math.log(child_fitness / parent_fitness))


class OperatorBandit(OperatorChooser):
    """Thompson sampling over operators (and LLM adapter versions) on gain per GPU-second; the
    engine's chooser when ``[bandit] enabled``."""

    def __init__(self, weights: Mapping[str, float], config: Optional[BanditConfig] = None) -> None:
        super().__init__(weights)
        self.config = config or BanditConfig()
        if not 0 <= self.config.explore <= 1 or self.config.prior_gain <= 0 or self.config.prior_cost_s <= 0:
            raise ValueError("bandit: explore in [0, 1], prior_gain and prior_cost_s > 0")
        self.version: dict[str, str] = {}      # operator -> the adapter its latest proposal used
        self.gain: Counter = Counter()         # arm -> summed gain
        self.llm_s: Counter = Counter()        # arm -> of which the model's own GPU seconds
        self.children: Counter = Counter()     # arm -> evaluated children
        self.gainers: Counter = Counter()      # arm -> children with a positive gain
        # the posterior: reward = gain in units, cost = GPU seconds (cost_s; the core the model bandit shares)
        self.rates = ThompsonRates(self.config.prior_gain, self.config.prior_cost_s)

    def arm(self, name: str, version: Optional[str] = None) -> str:
        """The arm of operator ``name`` answering with adapter ``version`` (its latest when None)."""
        v = self.version.get(name, "") if version is None else version
        return f"{name}@{v}" if v else name

    def _note_version(self, name: str, version: Optional[str]) -> None:
        if version is not None:
            self.version[name] = version

    def charge(self, name: str, gpu_s: float, version: Optional[str] = None) -> None:
        """Model GPU seconds of operator ``name`` (an LLM's inference): cost without a child."""
        self._note_version(name, version)
        arm = self.arm(name, version)
        self.llm_s[arm] += max(0.0, gpu_s)
        self.rates.add(arm, cost=gpu_s)

    def observe(self, name: str, gain: float, gpu_s: float, version: Optional[str] = None) -> None:
        """One evaluated child of ``name``: its gain over its parent and the GPU seconds it took
        (``version``: the adapter that wrote it, "" for the base model, None for non-LLM operators)."""
        self._note_version(name, version)
        arm = self.arm(name, version)
        self.children[arm] += 1
        self.gain[arm] += max(0.0, gain)
        self.gainers[arm] += gain > 0
        self.rates.add(arm, reward=max(0.0, gain) / self.config.unit, cost=gpu_s)

    @property
    def cost_s(self) -> Counter:
        """Arm -> GPU seconds charged (children's evaluations and the model's own): the posterior's cost."""
        return self.rates.cost

    def rate(self, name: str) -> float:
        """Posterior mean gain (log speedup) per GPU-second of ``name``'s current arm."""
        return self.rates.mean(self.arm(name)) * self.config.unit

    def draw(self, name: str, rng: random.Random) -> float:
        return self.rates.draw(self.arm(name), rng)

    def weights(self) -> dict[str, float]:
        """Posterior mean rates, normalised (what the progress display and events show)."""
        rates = {n: self.rate(n) for n in self.base}
        total = sum(rates.values()) or 1.0
        return {n: r / total for n, r in rates.items()}

    def order(self, rng: random.Random) -> list[str]:
        """Every operator once, the first being this step's choice (see the module docstring)."""
        names = list(self.base)
        if rng.random() < self.config.explore:
            rng.shuffle(names)
            return names
        draws = {n: self.draw(n, rng) for n in names}
        return sorted(names, key=lambda n: -draws[n])

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per arm: children, gainers, gain, GPU seconds (model's own among them), posterior rate."""
        arms = sorted(set(self.cost_s) | set(self.children) | {self.arm(n) for n in self.base})
        return {a: {"children": self.children[a], "gainers": self.gainers[a], "gain": round(self.gain[a], 6),
                    "gpu_s": round(self.cost_s[a], 6), "llm_gpu_s": round(self.llm_s[a], 6),
                    "rate_per_gpu_s": round(self.rates.mean(a) * self.config.unit, 6)} for a in arms}

