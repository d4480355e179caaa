"""Transfer: seed a new shape with what won on the archived shapes nearest to it.

Shapes are compared in (log2 M, log2 N, log2 K); only shapes of the same layout and contract
are neighbours at all. The elites of the nearest ones are re-rendered for the new shape through
their template and knobs (a knob set that is invalid there, e.g. a split-K deeper than K allows,
is skipped), so the new shape starts from kernels that were good nearby rather than from the
templates' generic first picks alone.
"""
from __future__ import annotations

import math
from typing import Callable, Iterable, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Shape, Template
from populations import TemplateError, knob_key

__all__ = ["shape_distance", "nearest_shapes", "transfer_candidates"]

ElitesOf = Callable[[Shape, int], Sequence[tuple[Candidate, Evaluation]]]


def shape_distance(a: Shape, b: Shape) -> float:
    """Euclidean distance in log2 space; infinite across layouts or contracts."""
    if a.layout != b.layout or a.contract != b.contract:
        return math.inf
    return math.sqrt(sum((math.log2(x) - math.log2(y)) ** 2 for x, y in ((a.m, b.m), (a.n, b.n), (a.k, b.k))))


def nearest_shapes(target: Shape, known: Iterable[Shape], k: int) -> list[Shape]:
    """Up to ``k`` shapes of ``known`` nearest to ``target`` (itself and other layouts excluded)."""
    pairs = [(shape_distance(target, s), str(s), s) for s in set(known) if s != target]
    pairs = [p for p in pairs if p[0] != math.inf]
    return [s for _, _, s in sorted(pairs)[:k]]


def transfer_candidates(target: Shape, known: Iterable[Shape], elites_of: ElitesOf,
                        templates: Mapping[str, Template], *, neighbors: int = 3, per_neighbor: int = 4,
                        specialize: bool = False, arch: str = "sm_90a") -> list[Candidate]:
    """Candidates for ``target`` re-rendered from the elites of its nearest archived shapes,
    nearest shape first, best elite first, one per distinct (template, knobs)."""
    out: list[Candidate] = []
    seen: set = set()
    for neighbor in nearest_shapes(target, known, neighbors):
        for cand, ev in elites_of(neighbor, per_neighbor):
            template: Optional[Template] = templates.get(cand.template or "")
            if template is None or cand.knobs is None or not template.applicable(target, arch):
                continue  # free-form (LLM) code cannot be re-rendered; it would need its own shape logic
            # shape-fitted knobs (a tile from an aligned neighbour stages what a ragged target needs)
            knobs = template.fitted(cand.knobs, target) or dict(cand.knobs)
            key = (template.name, knob_key(knobs))
            if key in seen or template.check(knobs, target):
                continue
            seen.add(key)
            try:
                out.append(template.candidate(
                    knobs, target, specialize=specialize, operator="transfer", parents=(cand.id,),
                    meta={"transfer_from": str(neighbor), "transfer_fitness": ev.fitness}))
            except TemplateError:
                continue
    return out
