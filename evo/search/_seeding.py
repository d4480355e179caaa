"""First populations from templates: heuristic picks, then valid samples spread far apart.

:func:`seed_population` is what ``evo seed`` writes and what the engine queues for a shape new
to an archive that transfer could not fill: per applicable template, its cuBLAS-like heuristic
picks first (tile by shape, split-K for small M·N with large K), then valid random samples
chosen to be far apart in the knob space (greedy farthest-point over per-axis distances,
:func:`knob_distance`), de-duplicated, each a Candidate with operator ``seed``.
"""
from __future__ import annotations

import random
from typing import Any, Mapping, Sequence, TypeVar

from populations import Candidate, KnobSpace, Shape, Template, knob_key

__all__ = ["seed_population", "by_rank", "knob_distance", "spread", "POOL_FACTOR"]

#: How many valid samples to draw per wanted diverse pick before choosing the spread subset.
POOL_FACTOR = 12


def knob_distance(space: KnobSpace, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Distance between two knob sets: per axis, the mean per-knob distance (ordered numeric
    domains by index distance over the domain's span, others 0/1), summed over axes, so every
    axis (tiling, loops, padding, swizzle, split-K, epilogue, ...) weighs the same."""
    per_axis: dict[str, list[float]] = {}
    for name, knob in space.knobs.items():
        va, vb = a.get(name, knob.default), b.get(name, knob.default)
        if knob.kind == "int" and len(knob.values) > 1:
            order = sorted(knob.values)
            d = abs(order.index(va) - order.index(vb)) / (len(order) - 1)
        else:
            d = 0.0 if va == vb else 1.0
        per_axis.setdefault(knob.axis, []).append(d)
    return sum(sum(ds) / len(ds) for ds in per_axis.values())


def spread(space: KnobSpace, pool: Sequence[Mapping[str, Any]], n: int,
           chosen: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Greedy farthest-point choice of ``n`` knob sets from ``pool``, far from ``chosen`` and each other."""
    picked: list[dict[str, Any]] = []
    anchors = list(chosen)
    rest = [dict(k) for k in pool]
    if not anchors and rest:
        picked.append(rest.pop(0))
        anchors.append(picked[-1])
    best = [min((knob_distance(space, k, a) for a in anchors), default=0.0) for k in rest]
    while rest and len(picked) < n:
        i = max(range(len(rest)), key=best.__getitem__)
        choice = rest.pop(i)
        best.pop(i)
        picked.append(choice)
        best = [min(d, knob_distance(space, k, choice)) for d, k in zip(best, rest)]
    return picked


T = TypeVar("T")

#: Picks per leading family seeded before any other family's (see :func:`seed_population`).
LEAD_RANKS = 2


def seed_population(shape: Shape, templates: Sequence[Template], per_template: int, rng: random.Random, *,
                    arch: str = "sm_90a", specialize: bool = False) -> list[Candidate]:
    """Heuristic picks, then spread-out valid samples, for every template applicable to ``shape``.

    The order is by rank, not by template: every template's first pick, then every second pick,
    and so on (templates built for ``arch``'s own features, Hopper's wgmma and TMA on sm_90a,
    ahead of portable ones at each rank). A run whose budget covers a few evaluations of a shape
    (a hundred shapes in minutes) then measures each family's best guess before any family's
    second, instead of spending them all on the first template by name.

    Families whose ``lead`` rule holds at ``shape`` go first: their first :data:`LEAD_RANKS` picks
    by rank before any other family's first, their later ones by rank among the others'. The
    decode families (gemv, swab, swpipe) lead on decode rows, where they gave 42 of the 48
    evolved kernels of the random-shape benchmark's seeds 5 and 6, and where a 100-shape run
    measures 7-9 candidates a shape (seed 6's 1x3968x1216 measured one gemv pick and four
    sm90_wgmma ones, 0.76-0.82x cuBLAS); the others keep a place early on (split-K wgmma won
    12x1070x20859).

    Families whose ``trail`` rule holds, on a target where another arch-native family applies, come
    :data:`LEAD_RANKS` ranks late: the portable mma.sync GEMMs (sm80_mma, streamk) past the decode
    rows on sm_90a, where sm90_wgmma and streamk90 do what they do with wgmma and TMA (at 3
    evaluations a shape, seed 9 spent one on sm80_mma's first pick on 80 rows, and it was the best
    on one), and streamk90 behind sm90_wgmma at mid M (seeds 13-14: better on 3 of 33 mid rows, by 0-7%). The
    latency family tiny keeps its rank (it won 6 mid rows of seeds 4-6)."""
    per: list[list[Candidate]] = []
    seen: set[str] = set()
    leading: list[list[Candidate]] = []
    trailing: list[list[Candidate]] = []
    native_here = {t.name for t in templates if _native(t, arch) and t.applicable(shape, arch)}
    for t in sorted(templates, key=lambda t: (not _native(t, arch), t.name)):
        if not t.applicable(shape, arch):
            continue
        heur = t.heuristic(shape, arch)[:per_template]
        want = per_template - len(heur)
        samples: list[dict[str, Any]] = []
        if want > 0:
            keys = {knob_key(k) for k in heur}
            pool = [k for k in t.sample(rng, shape, POOL_FACTOR * want, arch) if knob_key(t.space.complete(k)) not in keys]
            samples = spread(t.space, pool, want, heur)
        mine: list[Candidate] = []
        for origin, knob_sets in (("heuristic", heur), ("sample", samples)):
            for knobs in knob_sets:
                cand = t.candidate(knobs, shape, specialize, operator="seed", meta={"seed": origin})
                if cand.id not in seen:
                    seen.add(cand.id)
                    mine.append(cand)
        if t.leads(shape):
            leading.append(mine)
        elif native_here - {t.name} and t.trails(shape):  # another arch-native family applies
            trailing.append(mine)
        else:
            per.append(mine)
    # a trailing family's picks join the rank order LEAD_RANKS ranks late (None marks the gap)
    late: list[list[Any]] = [[None] * LEAD_RANKS + m for m in trailing]
    rest = by_rank([m[LEAD_RANKS:] for m in leading] + per + late)
    return by_rank([m[:LEAD_RANKS] for m in leading]) + [c for c in rest if c is not None]


def by_rank(lists: Sequence[Sequence[T]]) -> list[T]:
    """Every list's first item, then every second, and so on (a shorter list drops out)."""
    return [x for rank in range(max(map(len, lists), default=0)) for x in (m[rank] for m in lists if rank < len(m))]


def _native(t: Template, arch: str) -> bool:
    """Whether ``t`` needs the arch-specific features ``arch`` has (``sm_90a``'s wgmma and TMA)."""
    return bool(t.arch_features) and t.supports_arch(arch) and str(arch).strip().lower().endswith("a")

