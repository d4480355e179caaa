"""One shape's population and how parents are drawn from it.

Members are (candidate, evaluation) pairs with a fitness: evo's one elite ranking
(``populations.rank``: the median of ``Evaluation.fitness``, the device speedup over cuBLAS, over
the candidate's ``ok``, unflagged measurements at the shape; ties to more measurements, then the
smaller id), so the engine ranks exactly as the archive, ``evo inspect`` and ``evo export`` do. Two things are always kept: the elite set
(the best ``elites`` members) and, for diversity, the best member of every *feature cell*:
(template family, tile, stages, register bucket), so a good kernel of a rarer kind is not
crowded out by many near-copies of the leader. Parents are drawn from elites ∪ cell champions
by tournament or by a power law over fitness ranks.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from populations import Candidate, Evaluation, elite_fitness, elite_order

__all__ = ["Member", "Population", "feature_cell", "TILE_KNOBS", "STAGE_KNOBS"]

#: Knob names read as the block tile and the pipeline depth when present (templates name them so).
TILE_KNOBS = ("BM", "BN", "BK")
STAGE_KNOBS = ("STAGES", "NSTAGES", "PIPE")


@dataclass(frozen=True)
class Member:
    """A selectable candidate: its latest ok evaluation (what operators see), its fitness over
    ``measurements`` ok evaluations (``populations.elite_fitness``) and its diversity cell."""

    candidate: Candidate
    evaluation: Evaluation
    fitness: float = 0.0
    measurements: int = 1
    cell: tuple[Any, ...] = ()

    @property
    def id(self) -> str:
        return self.candidate.id


def feature_cell(candidate: Candidate, evaluation: Optional[Evaluation] = None,
                 families: Optional[Mapping[str, str]] = None, register_bucket: int = 32) -> tuple[Any, ...]:
    """The diversity cell of a candidate: (family, tile, stages, register bucket).

    Candidates without a template (LLM-written) share the family ``"free"`` and are told apart
    by their registers only.
    """
    knobs = candidate.knobs or {}
    if candidate.template is None:
        family = "free"
    else:
        family = (families or {}).get(candidate.template, candidate.template)
    tile = tuple(knobs.get(k) for k in TILE_KNOBS)
    stages = next((knobs[k] for k in STAGE_KNOBS if k in knobs), None)
    regs = evaluation.registers // register_bucket if evaluation is not None else None
    return (family, tile, stages, regs)


class Population:
    """The selectable members of one shape (see the module docstring)."""

    def __init__(self, elites: int = 8, cells: bool = True, register_bucket: int = 32,
                 families: Optional[Mapping[str, str]] = None, size: int = 64) -> None:
        self.n_elites = elites
        self.use_cells = cells
        self.register_bucket = register_bucket
        self.families = dict(families or {})
        self.size = size
        self._members: dict[str, Member] = {}
        self._fitnesses: dict[str, list[float]] = {}  # per member: the fitness of each ok evaluation
        self._cells: dict[tuple[Any, ...], Member] = {}
        self._banned: set[str] = set()
        self._pool: Optional[list[Member]] = None  # cached selection pool, dropped on every change
        self._best: Optional[Member] = None
        self.evaluated = 0
        self.failed = 0

    def __len__(self) -> int:
        return len(self._members)

    def add(self, candidate: Candidate, evaluation: Evaluation) -> bool:
        """Record one evaluation; True when it joined the population (it has a fitness)."""
        self.evaluated += 1
        if evaluation.fitness is None:
            self.failed += 1
            return False
        if candidate.id in self._banned:
            return False
        fits = self._fitnesses.setdefault(candidate.id, [])
        fits.append(float(evaluation.fitness))
        old = self._members.get(candidate.id)
        cell = old.cell if old is not None else feature_cell(candidate, evaluation, self.families,
                                                             self.register_bucket)
        member = Member(candidate, evaluation, elite_fitness(fits), len(fits), cell)
        self._members[candidate.id] = member
        self._pool = None
        # a re-measurement can lower a member's fitness: where it led, the lead is looked for again
        if self._best is None or self._best.id == member.id:
            self._best = min(self._members.values(), key=_rank)
        elif _rank(member) < _rank(self._best):
            self._best = member
        champ = self._cells.get(cell)
        if champ is not None and champ.id == member.id:
            self._cells[cell] = min((m for m in self._members.values() if m.cell == cell), key=_rank)
        elif champ is None or _rank(member) < _rank(champ):
            self._cells[cell] = member
        return True

    def ban(self, candidate_id: str) -> None:
        """Remove a candidate for good (it was incorrect or flagged at this shape once)."""
        self._banned.add(candidate_id)
        self._fitnesses.pop(candidate_id, None)
        gone = self._members.pop(candidate_id, None)
        if gone is None:
            return
        self._pool = None
        self._best = min(self._members.values(), key=_rank, default=None)
        if self._cells.get(gone.cell) is gone:
            rest = [m for m in self._members.values() if m.cell == gone.cell]
            if rest:
                self._cells[gone.cell] = min(rest, key=_rank)
            else:
                del self._cells[gone.cell]

    @property
    def best(self) -> Optional[Member]:
        return self._best

    def elites(self, n: Optional[int] = None) -> list[Member]:
        """The best ``n`` (default: the elite-set size) members, best first."""
        return sorted(self._members.values(), key=_rank)[: n or self.n_elites]

    def cells(self) -> dict[tuple[Any, ...], Member]:
        return dict(self._cells)

    def pool(self) -> list[Member]:
        """Who may be a parent, best first: elites plus every cell champion (or the top ``size``
        without cells)."""
        if self._pool is None:
            if not self.use_cells:
                self._pool = self.elites(max(self.size, self.n_elites))
            else:
                chosen = {m.id: m for m in self.elites()}
                for m in self._cells.values():
                    chosen.setdefault(m.id, m)
                self._pool = sorted(chosen.values(), key=_rank)
        return list(self._pool)

    def select(self, rng: random.Random, n: int, method: str = "tournament", *,
               tournament_size: int = 3, alpha: float = 1.5) -> list[Member]:
        """Up to ``n`` distinct parents (fewer when the pool is smaller)."""
        pool = self.pool()
        out: list[Member] = []
        while pool and len(out) < n:
            if method == "tournament":
                entrants = rng.sample(pool, min(tournament_size, len(pool)))
                pick = min(entrants, key=_rank)
            elif method == "power":
                weights = [(r + 1) ** -alpha for r in range(len(pool))]  # pool is sorted best first
                pick = rng.choices(pool, weights=weights, k=1)[0]
            else:
                raise ValueError(f"unknown selection method {method!r}")
            out.append(pick)
            pool = [m for m in pool if m.id != pick.id]
        return out


def _rank(m: Member) -> tuple[float, int, str]:
    """A member's sort key, best first (``populations.elite_order``)."""
    return elite_order(m.fitness, m.measurements, m.id)
