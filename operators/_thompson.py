"""Thompson sampling on a rate per arm: the one bandit core the LLM's model choice
(``operators.llm.ModelBandit``: improvements per thousand price-weighted tokens) and the engine's
operator choice (``evo.search``'s ``OperatorBandit``: gain per GPU-second) share.

Each arm produces reward as a Poisson process in what it costs, with a Gamma(``prior_reward``,
``prior_cost``) prior on its rate; after ``r`` reward for ``c`` cost the posterior is
Gamma(prior_reward + r, prior_cost + c). A draw samples one rate per arm from its posterior (the
caller takes the largest, or orders by them); the posterior mean is what displays show. An
untried arm gets tried (the prior is wide), one that spends without reward sinks. Thread-safe.
"""
from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Hashable, Iterable

__all__ = ["ThompsonRates"]


class ThompsonRates:
    """Gamma-Poisson posteriors of reward per unit cost, one per arm (see the module docstring)."""

    def __init__(self, prior_reward: float = 1.0, prior_cost: float = 1.0) -> None:
        if prior_reward <= 0 or prior_cost <= 0:
            raise ValueError("the bandit's prior reward and cost must be > 0")
        self.prior_reward, self.prior_cost = float(prior_reward), float(prior_cost)
        self.reward: Counter = Counter()
        self.cost: Counter = Counter()
        self._lock = threading.Lock()

    def add(self, arm: Hashable, reward: float = 0.0, cost: float = 0.0) -> None:
        """Count ``reward`` (>= 0) and ``cost`` (>= 0) for ``arm``."""
        with self._lock:
            self.reward[arm] += max(0.0, reward)
            self.cost[arm] += max(0.0, cost)

    def mean(self, arm: Hashable) -> float:
        """The posterior mean rate of ``arm``."""
        with self._lock:
            return (self.prior_reward + self.reward[arm]) / (self.prior_cost + self.cost[arm])

    def draw(self, arm: Hashable, rng: random.Random) -> float:
        """One rate of ``arm`` drawn from its posterior."""
        with self._lock:
            shape, rate = self.prior_reward + self.reward[arm], self.prior_cost + self.cost[arm]
        return rng.gammavariate(shape, 1.0 / rate)

    def draws(self, arms: Iterable[Hashable], rng: random.Random) -> dict[Hashable, float]:
        """One draw per arm, in the order given (so a seeded run draws the same)."""
        return {a: self.draw(a, rng) for a in arms}
