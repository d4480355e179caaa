"""Uniform random knob sets: the baseline every smarter sampler must beat, and a seeder.

Arity 0: the template is the fittest parent's when parents are given, else the best one in the
shape's history, else a random applicable one (``template=`` pins it). Knob sets already in the
history are skipped.
"""
from __future__ import annotations

import random
from typing import Optional

from populations import Shape

from ._base import Operator, OperatorContext, ParentView, Proposal
from ._knobs import choose_template, key_of, next_generation, seen_keys, shape_mismatch

__all__ = ["RandomKnobs"]


class RandomKnobs(Operator):
    """Valid knob sets drawn uniformly (rejection sampling through :meth:`Template.sample`)."""

    arity = 0

    def __init__(self, *, name: str = "knob_random", template: Optional[str] = None, specialize: bool = False) -> None:
        self.name = name
        self.template = template
        self.specialize = specialize

    def _propose(self, parents: tuple[ParentView, ...], shape: Shape, rng: random.Random, n: int,
                 context: OperatorContext) -> list[Proposal]:
        template, why = choose_template(parents, shape, rng, context, self.template)
        if template is None:
            return [self.failure(why, parents)]
        why = shape_mismatch(template, shape)
        if why:
            return [self.failure(why, parents)]
        seen = seen_keys(context.history)
        generic = not self.specialize
        known = sum(1 for k in seen if k[0] == template.name)
        out: list[Proposal] = []
        for knobs in template.sample(rng, shape, n + known):
            key = key_of(template.name, template.space.complete(knobs), generic)
            if key in seen:
                continue
            seen.add(key)
            out.append(self.build(template, knobs, shape, (), specialize=self.specialize,
                                  generation=next_generation((), context)))
            if len(out) == n:
                break
        if len(out) < n:
            reason = (f"template {template.name} gave only {len(out)} new valid knob sets for {shape} "
                      f"({known} already known): the space is exhausted or mostly invalid")
            out += [self.failure(reason)] * (n - len(out))
        return out
