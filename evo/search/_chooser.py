"""How the engine picks the operator for each step: one interface, two choosers.

:class:`OperatorChooser` is what the engine sees: ``order`` (every operator once, the first being
this step's choice), ``reward`` (a child was measured: did it make a new best?), ``charge`` (an
operator's model spent GPU seconds), ``observe`` (a child's gain over its parent and its GPU
seconds) and ``summary`` (what the run's ``stop`` event reports). :class:`WeightedChooser` orders
by the configured weights and ignores costs and gains (``charge``/``observe`` are no-ops, no
summary); ``evo.search._opbandit.OperatorBandit`` learns from them. The engine calls every
method on either, so it never asks which one it has.
"""
from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections import Counter
from typing import Any, Mapping, Optional

__all__ = ["OperatorChooser", "WeightedChooser"]


class OperatorChooser(ABC):
    """The engine's operator chooser (see the module docstring); ``weights`` is the configured
    share of each operator, and ``proposed``/``improved`` count measured children per operator."""

    def __init__(self, weights: Mapping[str, float]) -> None:
        self.base = dict(weights)
        self.proposed: Counter = Counter()
        self.improved: Counter = Counter()

    @abstractmethod
    def order(self, rng: random.Random) -> list[str]:
        """Every operator once, the first being this step's choice."""

    @abstractmethod
    def weights(self) -> dict[str, float]:
        """Each operator's current share (what progress and events show)."""

    def reward(self, name: str, improved: bool) -> None:
        """Count one measured child of ``name`` and whether it made a new best of its shape."""
        self.proposed[name] += 1
        if improved:
            self.improved[name] += 1

    def charge(self, name: str, gpu_s: float, version: Optional[str] = None) -> None:
        """GPU seconds operator ``name``'s model spent proposing (``version``: its adapter)."""

    def observe(self, name: str, gain: float, gpu_s: float, version: Optional[str] = None) -> None:
        """One measured child of operator ``name``: its gain over its parent and its GPU seconds
        (``version``: the adapter that wrote it, "" for the base model, None for non-LLM operators)."""

    def summary(self) -> Optional[dict[str, Any]]:
        """What the chooser learnt, for the ``stop`` event (None: nothing)."""
        return None


class WeightedChooser(OperatorChooser):
    """Orders the operators by the configured weights (the chooser without ``[bandit] enabled``)."""

    def weights(self) -> dict[str, float]:
        return dict(self.base)

    def order(self, rng: random.Random) -> list[str]:
        """Every operator once, in an order drawn by weight (the first is this step's choice)."""
        pool, out = self.weights(), []
        while pool:
            names = list(pool)
            pick = rng.choices(names, weights=[pool[n] for n in names], k=1)[0]
            out.append(pick)
            del pool[pick]
        return out
