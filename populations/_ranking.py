"""The one elite ranking of evo: how candidates at a shape are ordered, in the archive
(:meth:`Archive.elites`, ``evo inspect``, ``evo export``) and in the engine's populations alike.

A candidate's fitness at a shape is the **median** of :attr:`Evaluation.fitness` (its speedup
over cuBLAS) over its ``ok``, unflagged measurements there. The median, not the best: a kernel
measured twice at 1.0x and 1.4x has not shown it is a 1.4x kernel, and ranking by the maximum
rewards lucky timings (and re-measuring a candidate until one comes out fast). A candidate with
any ``incorrect`` or ``flagged`` measurement (or any flag) at the shape is no elite there at all;
other failures (timeouts, runtime errors) do not disqualify one that also measured ok.
Ties go to more measurements, then to the smaller id (a stable, reproducible order).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from ._records import Candidate, Evaluation, Status

__all__ = ["DISQUALIFYING", "Elite", "disqualifies", "elite_fitness", "elite_order", "rank"]

#: An evaluation with one of these outcomes says the *code* is wrong or cheating, so it
#: disqualifies its candidate at that shape whatever its other measurements say.
DISQUALIFYING = frozenset({Status.INCORRECT, Status.FLAGGED})


def disqualifies(status: Status, flagged: bool) -> bool:
    """Whether one measurement bans its candidate at its shape (see the module docstring)."""
    return status in DISQUALIFYING or flagged


def elite_fitness(fitnesses: Sequence[float]) -> float:
    """A candidate's fitness from the fitnesses of its counted measurements: their median."""
    return fitnesses[0] if len(fitnesses) == 1 else statistics.median(fitnesses)


def elite_order(fitness: float, measurements: int, candidate_id: str) -> tuple[float, int, str]:
    """The sort key of a ranked candidate, smaller first: higher fitness, then more
    measurements, then the smaller id."""
    return (-fitness, -measurements, candidate_id)


def rank(measurements: Iterable[tuple[str, Status, bool, Optional[float]]],
         top: Optional[int] = None) -> list[tuple[float, str, list[int]]]:
    """(fitness, candidate id, indexes of its counted measurements) of the ``top`` (default:
    every) elite, best first, from (candidate id, status, flagged, fitness) per measurement."""
    good: dict[str, list[int]] = {}
    fits: dict[str, list[float]] = {}
    banned: set[str] = set()
    for i, (cid, status, flagged, fitness) in enumerate(measurements):
        if disqualifies(status, flagged):
            banned.add(cid)
        elif fitness is not None:
            good.setdefault(cid, []).append(i)
            fits.setdefault(cid, []).append(fitness)
    # plain tuples: compared in C, no key function per row (ids are unique: idx never compared)
    rows = sorted((*elite_order(elite_fitness(fits[cid]), len(idx), cid), idx)
                  for cid, idx in good.items() if cid not in banned)
    return [(-r[0], r[2], r[3]) for r in (rows if top is None else rows[:max(top, 0)])]


@dataclass(frozen=True)
class Elite:
    """One candidate's standing at one shape: ``fitness`` as :func:`rank` computes it, over
    ``evaluations`` (its counted measurements, in archive order)."""

    candidate_id: str
    fitness: float
    evaluations: tuple[Evaluation, ...]
    candidate: Optional[Candidate]  # None only if its record was lost to corruption

    @property
    def latest(self) -> Evaluation:
        """The most recently archived of its ok evaluations (for timings and kernel stats)."""
        return self.evaluations[-1]
