"""Choosing a model per call: Thompson sampling on improvements per token.

Each model (arm) is modelled as producing improvements as a Poisson process in the tokens it
spends, with a Gamma(``alpha``, ``beta``) prior on its rate per 1,000 tokens. After ``k``
improvements for ``t`` thousand (price-weighted) tokens the posterior is Gamma(alpha + k,
beta + t); each call draws one rate per arm from its posterior and takes the largest. A model
that burns tokens without improving sinks; an untried one gets tried (the prior is wide). Tokens
of failed calls count too: a model whose answers never parse pays for them. Thread-safe.
"""
from __future__ import annotations

import random
import threading
from collections import Counter
from typing import Mapping, Sequence

from .._thompson import ThompsonRates

__all__ = ["ModelBandit"]


class ModelBandit:
    """Thompson sampling over model names (see the module docstring), on the shared core
    :class:`operators.ThompsonRates`: reward = improvements, cost = price x tokens / 1000."""

    def __init__(self, arms: Sequence[str], prices: Mapping[str, float] | None = None, *, alpha: float = 1.0,
                 beta: float = 1.0) -> None:
        if not arms or len(set(arms)) != len(arms):
            raise ValueError(f"the bandit needs distinct arms, got {list(arms)}")
        if alpha <= 0 or beta <= 0:
            raise ValueError("alpha and beta must be > 0")
        self.arms = list(arms)
        self.prices = {a: float((prices or {}).get(a, 1.0)) for a in self.arms}
        self.alpha, self.beta = alpha, beta
        self.tokens: Counter = Counter()
        self.calls: Counter = Counter()
        self.improvements: Counter = Counter()
        self._rates = ThompsonRates(alpha, beta)
        self._lock = threading.Lock()

    def choose(self, rng: random.Random) -> str:
        """One arm, drawn by Thompson sampling (a single arm is always chosen without a draw)."""
        if len(self.arms) == 1:
            return self.arms[0]
        draws = self._rates.draws(self.arms, rng)
        return max(self.arms, key=lambda a: draws[a])

    def spend(self, arm: str, tokens: int) -> None:
        """Count one call of ``arm`` and the tokens it used (successful or not)."""
        tokens = max(0, int(tokens))
        with self._lock:
            self.calls[arm] += 1
            self.tokens[arm] += tokens
        self._rates.add(arm, cost=self.prices.get(arm, 1.0) * tokens / 1000.0)

    def reward(self, arm: str, improvements: int = 1) -> None:
        """Count a child of ``arm`` that improved on its parent."""
        with self._lock:
            self.improvements[arm] += improvements
        self._rates.add(arm, reward=improvements)

    def rate(self, arm: str) -> float:
        """Posterior mean improvements per 1,000 tokens."""
        return self._rates.mean(arm)

    def summary(self) -> dict[str, dict[str, float]]:
        """Per arm: calls, tokens, improvements and the posterior mean rate (for events and reports)."""
        return {a: {"calls": self.calls[a], "tokens": self.tokens[a], "improvements": self.improvements[a],
                    "rate_per_1k_tokens": round(self.rate(a), 4)} for a in self.arms}
