"""How proposal slots go to shapes: one small interface, two rules.

A :class:`ShapeAllocator` gives each active shape a weight (the engine tells the pool the
weights: a pool of several GPUs shards by them) and hands the next slot to the shape whose
evaluations (finished + in flight) per unit of weight are fewest (``_budget.pick_shape``); a
shape whose weight fell to 0 yields its slots, announced once (a ``yield`` event). :class:`HeadroomShares` is
``[allocation] enabled = true`` (issue 26: weight = headroom to the shape's attainable time, 1
for its first ``min_evals`` evaluations, 0 when stalled or saturated (not while slower than its
baseline); ``_budget.shape_weights``); :class:`EvenShares` is ``enabled =
false`` (every shape the same weight: the shape with the fewest evaluations goes first).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Mapping, Sequence

from populations import Shape

from ._budget import pick_shape, shape_weights
from ._services import EngineServices
from ._shape_state import ShapeState

__all__ = ["ShapeAllocator", "EvenShares", "HeadroomShares", "make_allocator"]


class ShapeAllocator(ABC):
    """Weights of the active shapes, and the pick of the next slot by them."""

    def __init__(self, services: EngineServices) -> None:
        self.services = services

    @abstractmethod
    def weights(self, states: Sequence[ShapeState]) -> dict[Shape, float]:
        """A weight per shape of ``states`` (>= 0; 0: the shape yields its slots)."""

    def pick(self, states: Sequence[ShapeState], loads: Mapping[Shape, int]) -> Shape:
        """The shape of ``states`` (in run order) that gets the next slot: weighted fair sharing;
        a shape whose weight is 0 is announced the first time."""
        weights = self.weights(states)
        for st in states:
            if weights[st.shape] == 0 and not st.yielded:
                self._announce_yield(st)
        return pick_shape([s.shape for s in states], loads, weights)

    def _announce_yield(self, state: ShapeState) -> None:
        s = self.services
        state.yielded = True
        frac = state.attainable(s.calibration)
        why = "stalled" if state.stalled(s.config.allocation.stall_window) else "saturated"
        s.events.emit("yield", state.shape, why=why, attainable_frac=frac, evaluations=state.population.evaluated)
        s.progress.message(f"evo: {state.shape} yields its slots ({why}; "
                           f"{'-' if frac is None else f'{frac:.2f}'} of its attainable time)")


class EvenShares(ShapeAllocator):
    """Every shape the same weight."""

    def weights(self, states: Sequence[ShapeState]) -> dict[Shape, float]:
        return {s.shape: 1.0 for s in states}


class HeadroomShares(ShapeAllocator):
    """Weight by headroom to the attainable time under the archive's calibration (see ``_budget.py``)."""

    def weights(self, states: Sequence[ShapeState]) -> dict[Shape, float]:
        s = self.services
        alloc = s.config.allocation
        return shape_weights({st.shape: st.attainable(s.calibration) for st in states},
                             {st.shape: st.stalled(alloc.stall_window) for st in states}, alloc.saturated,
                             fresh={st.shape: st.population.evaluated < alloc.min_evals for st in states},
                             behind={st.shape: _behind(st) for st in states})


def _behind(state: ShapeState) -> bool:
    """Whether the shape's best ok result is still slower than its baseline (speedup < 1)."""
    best = state.population.best
    return best is not None and best.fitness is not None and best.fitness < 1.0


def make_allocator(services: EngineServices) -> ShapeAllocator:
    """The allocator ``[allocation]`` asks for."""
    return HeadroomShares(services) if services.config.allocation.enabled else EvenShares(services)
