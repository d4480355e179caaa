"""One record per shape: everything the engine keeps about a shape it evolves.

The engine used to keep a dict per concern keyed by shape (populations, convergence, stall
detection, best time, queue, known ids, history, fitness map) and sets of shapes for the
converged and yielded flags; they were always indexed together, so they are one
:class:`ShapeState` now and the engine keeps one ``dict[Shape, ShapeState]``. The record is
created once per shape and never replaced (its containers change in place); the proposer and the
recorder act on the record they are handed.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping, Optional

from populations import Calibration, Candidate, Evaluation, Shape, attainable_frac, disqualifies

from ._budget import Convergence
from ._config import RunConfig
from ._selection import Population

__all__ = ["ShapeState"]


@dataclass(eq=False)
class ShapeState:
    """What the engine knows about one shape (see the module docstring)."""

    shape: Shape
    population: Population
    #: convergence of the best fitness over ``converge_window`` evaluations (the shape stops)
    conv: Convergence
    #: no improvement over ``[allocation] stall_window`` evaluations (the shape yields its slots)
    stall: Convergence
    #: fastest ok device median so far (seconds)
    best_time: Optional[float] = None
    #: candidates waiting to be submitted, with the name of what made them (an operator, seed, transfer)
    queue: deque[tuple[Candidate, str]] = field(default_factory=deque)
    #: ids evaluated at the shape or in flight (de-duplication)
    known: set[str] = field(default_factory=set)
    #: every (candidate, evaluation) observed, in order (what operators see as history)
    history: list[tuple[Candidate, Evaluation]] = field(default_factory=list)
    #: latest fitness per candidate id (None when flagged or failed): parents' fitness for the bandit
    fitness_of: dict[str, Optional[float]] = field(default_factory=dict)
    #: the allocation weight fell to 0 (announced once)
    yielded: bool = False
    #: convergence reached: no more proposals for this shape
    converged: bool = False

    @classmethod
    def start(cls, shape: Shape, config: RunConfig, families: Mapping[str, str]) -> "ShapeState":
        """An empty record for ``shape`` under the run's selection, convergence and allocation settings."""
        sel, alloc = config.selection, config.allocation
        return cls(shape,
                   Population(sel.elites, sel.cells, sel.register_bucket, families, sel.population),
                   Convergence(config.converge_window, config.converge_threshold),
                   Convergence(alloc.stall_window or None, alloc.stall_threshold))

    def observe(self, cand: Candidate, ev: Evaluation) -> bool:
        """Feed one evaluation to the population, convergence, stall detection and best time;
        True on a new best."""
        population = self.population
        self.history.append((cand, ev))
        self.fitness_of[cand.id] = None if ev.flags else ev.fitness
        if disqualifies(ev.status, bool(ev.flags)):
            population.ban(cand.id)
        before = population.best
        population.add(cand, ev)
        self.conv.observe(ev.fitness)
        self.stall.observe(ev.fitness)
        t = ev.timers.get("device")
        if ev.fitness is not None and t is not None and t.median > 0:
            self.best_time = t.median if self.best_time is None else min(self.best_time, t.median)
        after = population.best
        return after is not None and (before is None or after.fitness > before.fitness)

    def attainable(self, calibration: Calibration) -> Optional[float]:
        """The best device time as a fraction of the shape's floor-aware attainable time."""
        return attainable_frac(self.shape, self.best_time, calibration)

    def stalled(self, window: int) -> bool:
        """No improvement over the stall ``window`` (0: never), or (a shape whose every result
        failed so far) a quarter of it (at least 8) evaluations without one ok result."""
        if not window:
            return False
        if self.best_time is None:
            return self.population.evaluated >= max(8, window // 4)
        return self.stall.converged

    def elite_threshold(self, margin: float) -> Optional[float]:
        """The speedup a new candidate must reach to join the elites now, times ``margin`` (None
        while the elite set is not full); the evaluator skips its memoisation pass below it."""
        elites = self.population.elites()
        if len(elites) < self.population.n_elites:
            return None
        return elites[-1].fitness * margin
