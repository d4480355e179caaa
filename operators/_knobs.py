"""Knob-level helpers shared by the structured operators.

Ordered domains (integer knobs with more than two values) are walked by neighbour steps in
sorted order, because a tile of 128 is more like 64 and 256 than like 16; bools flip and string
knobs (unordered) jump. Repair is a bounded hill climb on the number of violated constraints,
touching only knobs that the violated constraints mention.
"""
from __future__ import annotations

import math
import random
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Knob, Shape, Template

from ._base import OperatorContext, ParentView, score

__all__ = ["search", "domain", "is_ordered", "neighbour", "involved_knobs", "repair", "seen_keys", "key_of",
           "shape_mismatch", "base_knobs", "next_generation", "choose_template", "pick_knobs"]

KnobSet = dict[str, Any]


def domain(knob: Knob) -> tuple[Any, ...]:
    """The knob's values in walking order: sorted for ints, as declared otherwise."""
    return tuple(sorted(knob.values)) if knob.kind == "int" else tuple(knob.values)


def is_ordered(knob: Knob) -> bool:
    return knob.kind == "int" and len(knob.values) > 2


def neighbour(knob: Knob, value: Any, rng: random.Random, locality: float = 0.85,
              feasible: Optional[Callable[[Any], bool]] = None) -> Any:
    """A value other than ``value``: a step of 1 (or 2) in an ordered domain with probability
    ``locality``, else any other value uniformly. Returns ``value`` for single-valued knobs.

    ``feasible(v)`` (e.g. "the knob set with ``v`` breaks no constraint"): the steps walk only the
    values it accepts, so a domain that is mostly invalid in this context (sm90_wgmma's BN in NN:
    4 of 32 widths) is walked over its valid values, 64 -> 128 -> 192, instead of stepping into an
    invalid neighbour every time. It is asked lazily, nearest values first; when it accepts no
    neighbour the plain walk is used (the caller's repair may fix it). The non-local jump ignores
    it, so values reachable only through a repair of other knobs stay reachable."""
    values = domain(knob)
    if len(values) < 2:
        return value
    if value not in values:
        return rng.choice(values)
    others = [v for v in values if v != value]
    if len(others) == 1:
        return others[0]
    if is_ordered(knob) and rng.random() < locality:
        i = values.index(value)
        step = 1 if rng.random() < 0.75 else 2
        if feasible is not None:
            picked = _feasible_step(values, i, step, rng, feasible)
            if picked is not None:
                return picked
        j = i + rng.choice((-step, step))
        if not 0 <= j < len(values):
            j = i - (j - i)  # reflect at the ends of the domain
        j = min(max(j, 0), len(values) - 1)
        if j != i:
            return values[j]
    return rng.choice(others)


def _feasible_step(values: Sequence[Any], i: int, step: int, rng: random.Random,
                   feasible: Callable[[Any], bool]) -> Any:
    """Walking from index ``i`` towards a side drawn at random (the other side when this one has
    no feasible value): the ``step``-th feasible value met, or the last one met when fewer lie on
    that side. None when neither side has one."""
    sides = [-1, 1]
    rng.shuffle(sides)
    for direction in sides:
        met = None
        left = step
        j = i + direction
        while 0 <= j < len(values) and left:
            if feasible(values[j]):
                met, left = values[j], left - 1
            j += direction
        if met is not None:
            return met
    return None


def pick_knobs(template: Template, names: Sequence[str], count: int, rng: random.Random) -> list[str]:
    """``count`` distinct knobs of ``names``: an axis first (uniformly over the axes present),
    then a knob within it, so every axis (tiling, loops, padding, swizzle, ...) gets its turn
    however many knobs it has."""
    pool = list(names)
    chosen: list[str] = []
    while pool and len(chosen) < count:
        axes = sorted({template.space.knobs[k].axis for k in pool})
        axis = rng.choice(axes)
        name = rng.choice([k for k in pool if template.space.knobs[k].axis == axis])
        chosen.append(name)
        pool.remove(name)
    return chosen


def involved_knobs(template: Template, reasons: Sequence[str]) -> set[str]:
    """Knobs mentioned (directly or through derived values) by the constraints behind ``reasons``."""
    return template.space.knobs_behind(reasons)


def repair(template: Template, knobs: Mapping[str, Any], shape: Shape, rng: random.Random, *,
           frozen: Iterable[str] = (), budget: int = 2, tries: int = 24,
           propose: Optional[Callable[[str, Any], Any]] = None) -> Optional[KnobSet]:
    """A valid knob set near ``knobs`` changing at most ``budget`` knobs outside ``frozen``, or None.

    Each step moves one knob that a violated constraint mentions (``propose(name, value)`` picks
    the new value; default: :func:`neighbour`) and keeps the move when fewer constraints fail.
    """
    current = dict(knobs)
    reasons = template.check(current, shape)
    frozen = set(frozen)
    changed: set[str] = set()
    for _ in range(tries):
        if not reasons:
            return current
        movable = sorted(involved_knobs(template, reasons) - frozen)
        if len(changed) >= budget:
            movable = [k for k in movable if k in changed]
        movable = [k for k in movable if len(template.space.knobs[k].values) > 1]
        if not movable:
            return None
        name = rng.choice(movable)
        value = propose(name, current[name]) if propose else neighbour(template.space.knobs[name], current[name], rng)
        trial = dict(current)
        trial[name] = value
        after = template.check(trial, shape)
        if len(after) < len(reasons):
            current, reasons = trial, after
            changed.add(name)
    return current if not reasons else None


def search(draw: Callable[[], tuple[KnobSet, Any]], fix: Callable[[KnobSet, Any], Optional[KnobSet]],
           template: Template, shape: Shape, seen: set, generic: bool, attempts: int,
           what: str) -> tuple[Optional[KnobSet], Any, str]:
    """Draw children until one is valid (after ``fix``, a repair) and not in ``seen``.

    Returns (child, the draw's info, "") and adds the child to ``seen``, or (None, None, why)
    after ``attempts`` draws, the reason counting invalid and already-known children.
    """
    invalid = duplicates = 0
    last = ""
    for _ in range(attempts):
        child, info = draw()
        reasons = template.check(child, shape)
        if reasons:
            fixed = fix(child, info)
            if fixed is None:
                invalid += 1
                last = "; ".join(reasons)
                continue
            child = fixed
        key = key_of(template.name, child, generic)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        return child, info, ""
    return None, None, (f"no new valid {what} at {shape} in {attempts} attempts "
                        f"({invalid} invalid, {duplicates} already known)" + (f"; last violation: {last}" if last else ""))


def key_of(template: str, knobs: Mapping[str, Any], generic: bool) -> tuple:
    return (template, tuple(sorted((k, repr(v)) for k, v in knobs.items())), bool(generic))


def seen_keys(history: Iterable[tuple[Candidate, Evaluation]], extra: Iterable[Candidate] = ()) -> set[tuple]:
    """Knob identities of template-built candidates already in the history (and ``extra``)."""
    out = set()
    for cand in [c for c, _ in history] + list(extra):
        if cand.template and cand.knobs is not None:
            out.add(key_of(cand.template, cand.knobs, cand.generic))
    return out


def shape_mismatch(template: Template, shape: Shape) -> Optional[str]:
    """Why ``template`` cannot serve ``shape`` at all (layout or contract), or None."""
    if shape.layout not in template.layouts:
        return f"template {template.name} has no {shape.layout} layout (it has {list(template.layouts)})"
    if shape.contract not in template.contracts:
        return f"template {template.name} does not implement the {shape.contract} contract"
    return None


def base_knobs(template: Template, knobs: Optional[Mapping[str, Any]]) -> KnobSet:
    """A complete knob set from a parent's knobs: values outside today's domains fall back to defaults."""
    out = template.space.defaults()
    for name, value in (knobs or {}).items():
        knob = template.space.knobs.get(name)
        if knob is not None and value in knob.values and type(value) is type(knob.default):
            out[name] = value
    return out


def next_generation(parents: Sequence[ParentView], context: OperatorContext) -> int:
    """One past the newest parent (or, for samplers, past the newest candidate in the history)."""
    if parents:
        return 1 + max(p.candidate.generation for p in parents)
    return 1 + max((c.generation for c, _ in context.history), default=-1)


def choose_template(parents: Sequence[ParentView], shape: Shape, rng: random.Random, context: OperatorContext,
                    preferred: Optional[str] = None) -> tuple[Optional[Template], str]:
    """The template a sampler works on: ``preferred``, else the fittest parent's, else the one
    of the best candidate in the history, else a random applicable one. (template, why-not)."""
    if preferred:
        t = context.template(preferred)
        return (t, "") if t is not None else (None, f"template {preferred!r} is not loaded")
    ranked = sorted((p for p in parents if context.template(p.template)), key=lambda p: -p.score)
    if ranked:
        return context.template(ranked[0].template), ""
    best, best_score = None, -math.inf
    for cand, ev in context.at(shape):
        s = score(ev)
        if context.template(cand.template) and s > best_score:
            best, best_score = cand.template, s
    if best is not None:
        return context.template(best), ""
    names = sorted(n for n, t in context.templates.items() if t.applicable(shape, context.arch))
    if not names:
        return None, f"no loaded template applies to {shape} on arch {context.arch} ({len(context.templates)} loaded)"
    return context.templates[rng.choice(names)], ""
