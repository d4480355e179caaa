"""Knob crossover: a child whose every knob comes from one of two parents of the same template.

``mode="uniform"`` takes each differing knob from either parent; ``mode="axis"`` takes whole
axes (all tiling knobs from one parent, all loop knobs from the other, ...), which keeps knobs
that were tuned together together; ``"mixed"`` picks one of the two per child. An invalid child
is repaired by flipping knobs to the *other* parent's value, so children never hold a value that
neither parent had. Parents of different templates (or one parent, or identical parents) fall
back to mutating the fitter one (``fallback="mutation"``) or give a failure (``"fail"``); so do
two parents whose every child is already known (converged parents), once ``max_attempts`` draws
found nothing new.
"""
from __future__ import annotations

import random
from typing import Any, Optional

from populations import Shape, Template

from ._base import Operator, OperatorContext, ParentView, Proposal
from ._knobs import base_knobs, key_of, next_generation, repair, search, seen_keys, shape_mismatch
from ._mutation import KnobMutation

__all__ = ["KnobCrossover"]

MODES = ("uniform", "axis", "mixed")


class KnobCrossover(Operator):
    """Recombine two parents' knobs (arity 2)."""

    arity = 2

    def __init__(self, *, name: str = "knob_crossover", mode: str = "mixed", fallback: str = "mutation",
                 max_attempts: int = 64, specialize: Optional[bool] = None, **mutation_options: Any) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if fallback not in ("mutation", "fail"):
            raise ValueError(f"fallback must be 'mutation' or 'fail', got {fallback!r}")
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.name = name
        self.mode = mode
        self.fallback = fallback
        self.max_attempts = max_attempts
        self.specialize = specialize
        self._mutation = KnobMutation(name=name, specialize=specialize, **mutation_options)

    def _propose(self, parents: tuple[ParentView, ...], shape: Shape, rng: random.Random, n: int,
                 context: OperatorContext) -> list[Proposal]:
        if len(parents) < 2:
            return self._fall_back(parents, shape, rng, n, context, f"crossover needs two parents, got {len(parents)}")
        a, b = parents[0], parents[1]
        if not a.template or a.template != b.template:
            return self._fall_back(parents[:2], shape, rng, n, context,
                                   f"parents come from different templates ({a.template} and {b.template})")
        template = context.template(a.template)
        if template is None:
            return [self.failure(f"template {a.template!r} of both parents is not loaded", parents[:2])]
        why = shape_mismatch(template, shape)
        if why:
            return [self.failure(why, parents[:2])]
        ka, kb = base_knobs(template, a.candidate.knobs), base_knobs(template, b.candidate.knobs)
        diff = [k for k in template.space.knobs if ka[k] != kb[k]]
        if len(diff) < 2:  # one differing knob: every child is a copy of a parent
            return self._fall_back(parents[:2], shape, rng, n, context,
                                   f"parents differ in {len(diff)} knob(s): nothing to recombine")
        specialize = self.specialize if self.specialize is not None else not (a.candidate.generic and b.candidate.generic)
        seen = seen_keys(context.history, [a.candidate, b.candidate])
        seen |= {key_of(template.name, ka, not specialize), key_of(template.name, kb, not specialize)}
        generation = next_generation([a, b], context)
        out: list[Proposal] = []
        for _ in range(n):
            child, mode, why = self._one(template, ka, kb, diff, shape, rng, seen, not specialize)
            if child is None:  # every child of these two is known or invalid: mutate instead, or fail
                return out + self._fall_back((a, b), shape, rng, n - len(out), context, why)
            origin = {k: ("a" if child[k] == ka[k] else "b") for k in diff}
            out.append(self.build(template, child, shape, [a, b], specialize=specialize, generation=generation,
                                  meta={"mode": mode, "from": origin}))
        return out

    def _one(self, template: Template, ka: dict[str, Any], kb: dict[str, Any], diff: list[str], shape: Shape,
             rng: random.Random, seen: set, generic: bool) -> tuple[Optional[dict[str, Any]], str, str]:
        axes = sorted({template.space.knobs[k].axis for k in diff})

        def draw() -> tuple[dict[str, Any], str]:
            mode = self.mode if self.mode != "mixed" else rng.choice(("uniform", "axis"))
            if mode == "axis" and len(axes) > 1:
                side = {ax: rng.random() < 0.5 for ax in axes}
                if len(set(side.values())) == 1:
                    side[rng.choice(axes)] ^= True
                take_b = {k: side[template.space.knobs[k].axis] for k in diff}
            else:
                mode = "uniform"
                take_b = {k: rng.random() < 0.5 for k in diff}
                if len(set(take_b.values())) == 1:
                    take_b[rng.choice(diff)] ^= True
            child = dict(ka)
            child.update({k: kb[k] for k in diff if take_b[k]})
            return child, mode

        def other(name: str, value: Any) -> Any:  # repair moves a knob to the other parent's value
            return kb[name] if value == ka[name] else ka[name]

        def fix(child: dict[str, Any], mode: str) -> Optional[dict[str, Any]]:
            return repair(template, child, shape, rng, frozen=set(template.space.knobs) - set(diff),
                          budget=len(diff), propose=other)

        child, mode, why = search(draw, fix, template, shape, seen, generic, self.max_attempts,
                                  f"child of the two {template.name} parents")
        return child, mode or "", why

    def _fall_back(self, parents: tuple[ParentView, ...], shape: Shape, rng: random.Random, n: int,
                   context: OperatorContext, why: str) -> list[Proposal]:
        usable = [p for p in parents if context.template(p.template)]
        if self.fallback == "fail" or not usable:
            extra = "" if usable or not parents else " and no parent has a loaded template to mutate"
            return [self.failure(why + extra, parents)]
        fitter = max(usable, key=lambda p: p.score)  # max keeps the first of equals
        return self._mutation.mutate(fitter, shape, rng, n, context, meta={"fallback": f"mutation of the fitter parent: {why}"})
