"""Knob mutation: a child that differs from its parent in one or a few knobs.

Which knobs: an axis is picked uniformly among the axes the template has (tiling, loops, padding,
swizzle, ...), then a knob of it; usually one knob, sometimes more (``more_changes`` is the chance
of each extra one, up to ``max_changes``). Ordered domains step to neighbouring values. A child
that breaks a constraint is repaired (at most ``max_repair`` further knobs move) or drawn again,
for at most ``max_attempts`` draws per requested child; known knob sets are never proposed twice.
"""
from __future__ import annotations

import random
from typing import Any, Mapping, Optional, Sequence

from populations import Shape, Template

from ._base import Operator, OperatorContext, ParentView, Proposal
from ._knobs import base_knobs, key_of, neighbour, next_generation, pick_knobs, repair, search, seen_keys, shape_mismatch

__all__ = ["KnobMutation"]


class KnobMutation(Operator):
    """Mutate one parent's knobs (arity 1)."""

    arity = 1

    def __init__(self, *, name: str = "knob_mutation", max_changes: int = 3, more_changes: float = 0.35,
                 locality: float = 0.85, max_attempts: int = 64, max_repair: int = 2,
                 axes: Optional[Sequence[str]] = None, specialize: Optional[bool] = None) -> None:
        if max_changes < 1 or max_attempts < 1 or max_repair < 0:
            raise ValueError("max_changes and max_attempts must be >= 1 and max_repair >= 0")
        if not 0.0 <= more_changes < 1.0 or not 0.0 <= locality <= 1.0:
            raise ValueError("more_changes must be in [0, 1) and locality in [0, 1]")
        self.name = name
        self.max_changes = max_changes
        self.more_changes = more_changes
        self.locality = locality
        self.max_attempts = max_attempts
        self.max_repair = max_repair
        self.axes = tuple(axes) if axes else None
        self.specialize = specialize

    def _propose(self, parents: tuple[ParentView, ...], shape: Shape, rng: random.Random, n: int,
                 context: OperatorContext) -> list[Proposal]:
        if not parents:
            return [self.failure("knob mutation needs a parent; none was given")]
        return self.mutate(parents[0], shape, rng, n, context)

    def mutate(self, parent: ParentView, shape: Shape, rng: random.Random, n: int, context: OperatorContext,
               meta: Optional[Mapping[str, Any]] = None) -> list[Proposal]:
        """``n`` mutants of ``parent`` (also used by crossover as its fallback, with ``meta``)."""
        if not parent.template:
            return [self.failure(f"parent {parent.id} was not built from a template: it has no knobs to mutate", [parent])]
        template = context.template(parent.template)
        if template is None:
            return [self.failure(f"parent {parent.id}'s template {parent.template!r} is not loaded", [parent])]
        why = shape_mismatch(template, shape)
        if why:
            return [self.failure(why, [parent])]
        names = [k for k, knob in template.space.knobs.items()
                 if len(knob.values) > 1 and (self.axes is None or knob.axis in self.axes)]
        if not names:
            return [self.failure(f"template {template.name} has no mutable knob on axes {self.axes or 'any'}", [parent])]
        base = base_knobs(template, parent.candidate.knobs)
        reasons = template.check(base, shape)
        if reasons:  # e.g. a parent from another shape whose SPLIT_K does not fit this K: repair it first
            fixed = repair(template, base, shape, rng, budget=len(base), tries=16 * len(base))
            if fixed is None:
                return [self.failure(f"parent {parent.id} is invalid at {shape} and could not be repaired: "
                                     + "; ".join(reasons), [parent])]
            meta = {**(meta or {}), "repaired_parent": sorted(k for k in base if base[k] != fixed[k])}
            base = fixed
        specialize = self.specialize if self.specialize is not None else not parent.candidate.generic
        seen = seen_keys(context.history, [parent.candidate])
        seen.add(key_of(template.name, base, not specialize))
        generation = next_generation([parent], context)
        out: list[Proposal] = []
        for _ in range(n):
            child, why = self._one(template, base, names, shape, rng, seen, not specialize)
            if child is None:
                # the neighbourhood is exhausted or invalid: the remaining slots would fail alike
                out += [self.failure(why, [parent])] * (n - len(out))
                break
            changed = sorted(k for k in child if child[k] != base[k])
            info = {"changed": changed, "axes": sorted({template.space.knobs[k].axis for k in changed})}
            info.update(meta or {})
            out.append(self.build(template, child, shape, [parent], specialize=specialize,
                                  generation=generation, meta=info))
        return out

    def _one(self, template: Template, base: dict[str, Any], names: list[str], shape: Shape,
             rng: random.Random, seen: set, generic: bool) -> tuple[Optional[dict[str, Any]], str]:
        def draw() -> tuple[dict[str, Any], list[str]]:
            count = 1
            while count < min(self.max_changes, len(names)) and rng.random() < self.more_changes:
                count += 1
            chosen = pick_knobs(template, names, count, rng)
            child = dict(base)
            for name in chosen:  # steps walk the values valid beside the knobs already set
                child[name] = neighbour(template.space.knobs[name], base[name], rng, self.locality,
                                        feasible=lambda v, n=name, c=child: not template.check({**c, n: v}, shape))
            return child, chosen

        def fix(child: dict[str, Any], chosen: list[str]) -> Optional[dict[str, Any]]:
            if not self.max_repair:
                return None
            return repair(template, child, shape, rng, frozen=chosen, budget=self.max_repair)

        child, _, why = search(draw, fix, template, shape, seen, generic, self.max_attempts,
                               f"mutant of template {template.name}")
        return child, why
