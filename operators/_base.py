"""The operator interface: frozen views in, frozen proposals out.

An :class:`Operator` turns parents (a :class:`ParentView` pairs a candidate with its evaluation
at the target shape) and read-only history (:class:`OperatorContext`) into :class:`Proposal`
records. Operators never evaluate and never write the archive; stateful ones (Optuna) learn
outcomes through :meth:`Operator.tell` or from the history they are handed next time.

Every way an operator can come up empty is a *counted outcome*: a failure :class:`Proposal`
with a reason. :meth:`Operator.propose` also turns an unexpected exception inside an
implementation into such a failure (reason ``"operator error: ..."``), so one bad operator
cannot stop a run; the conformance tests make sure our own operators never produce one.
"""
from __future__ import annotations

import abc
import math
import random
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from populations import Candidate, Evaluation, Shape, Template, TemplateError

__all__ = ["Operator", "ParentView", "OperatorContext", "Proposal", "OPERATOR_ERROR", "score"]

#: Prefix of the reason of a failure that came from an exception inside an operator (a bug).
OPERATOR_ERROR = "operator error: "


def score(evaluation: Optional[Evaluation]) -> float:
    """log(speedup) of an evaluation that has a fitness; ``-inf`` for failures and the unmeasured."""
    fit = evaluation.fitness if evaluation is not None else None
    if fit is None or not fit > 0 or math.isnan(fit):
        return -math.inf
    return math.log(fit)


@dataclass(frozen=True)
class ParentView:
    """A parent: a candidate and its evaluation at the target shape (None when not measured there)."""

    candidate: Candidate
    evaluation: Optional[Evaluation] = None

    def __post_init__(self) -> None:
        if not isinstance(self.candidate, Candidate):
            raise TypeError(f"ParentView.candidate must be a Candidate, got {type(self.candidate).__name__}")
        if self.evaluation is not None and not isinstance(self.evaluation, Evaluation):
            raise TypeError(f"ParentView.evaluation must be an Evaluation or None, got {type(self.evaluation).__name__}")

    @property
    def id(self) -> str:
        return self.candidate.id

    @property
    def template(self) -> Optional[str]:
        return self.candidate.template

    @property
    def knobs(self) -> Mapping[str, Any]:
        """The parent's knobs, read-only (empty for candidates not built from a template)."""
        return MappingProxyType(dict(self.candidate.knobs or {}))

    @property
    def fitness(self) -> Optional[float]:
        return self.evaluation.fitness if self.evaluation is not None else None

    @property
    def score(self) -> float:
        """log(speedup), ``-inf`` when failed or unmeasured: what 'fitter' means for operators."""
        return score(self.evaluation)


@dataclass(frozen=True)
class OperatorContext:
    """Read-only inputs an operator may consult: one shape's history and the loaded templates.

    ``history`` holds (candidate, evaluation) pairs measured at the shape being proposed for;
    ``arch`` is the target GPU (compute capability or ``"sm_90a"``) for choosing templates.
    """

    history: Sequence[tuple[Candidate, Evaluation]] = ()
    templates: Mapping[str, Template] = field(default_factory=dict)
    arch: Union[int, str] = 90

    def __post_init__(self) -> None:
        object.__setattr__(self, "history", tuple((c, e) for c, e in self.history))
        # bound to the target arch, so every operator's check/sample obeys ARCH constraints
        object.__setattr__(self, "templates", MappingProxyType({n: t.for_arch(self.arch) for n, t in self.templates.items()}))

    @cached_property
    def known_ids(self) -> frozenset[str]:
        """Ids of every candidate in the history."""
        return frozenset(c.id for c, _ in self.history)

    def at(self, shape: Shape) -> tuple[tuple[Candidate, Evaluation], ...]:
        """History entries evaluated at ``shape``."""
        return tuple((c, e) for c, e in self.history if e.shape == shape)

    def template(self, name: Optional[str]) -> Optional[Template]:
        return self.templates.get(name) if name else None


@dataclass(frozen=True)
class Proposal:
    """What an operator returns for one requested slot: a candidate, or a failure with its reason."""

    operator: str
    candidate: Optional[Candidate] = None
    reason: str = ""
    parents: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "parents", tuple(self.parents))
        if self.candidate is None and not self.reason.strip():
            raise ValueError("a failed proposal needs a reason")
        if self.candidate is not None and self.reason:
            raise ValueError("a proposal is either a candidate or a failure with a reason, not both")

    @property
    def ok(self) -> bool:
        return self.candidate is not None


class Operator(abc.ABC):
    """Base of every proposal operator.

    Subclasses set ``name`` and ``arity`` (1: mutation, 2: crossover, 0: samplers that need
    only history) and implement :meth:`_propose`. The engine calls :meth:`propose` and
    :meth:`tell`. Operators that call a model derive from :class:`operators.ModelOperator`,
    which adds the members only they need (asynchronous calls, batch, tokens and GPU seconds,
    warm-up, cancel).
    """

    name: str = "operator"
    arity: int = 1

    def propose(self, parents: Sequence[ParentView], shape: Shape, rng: random.Random, n: int,
                context: Optional[OperatorContext] = None) -> list[Proposal]:
        """Up to ``n`` proposals for ``shape``: candidates, or failures with reasons (never raises
        for a bad parent, an empty history or an exhausted space)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        if not isinstance(shape, Shape):
            raise TypeError(f"shape must be a populations.Shape, got {type(shape).__name__}")
        if not isinstance(rng, random.Random):
            raise TypeError("rng must be a random.Random (seed it for reproducible proposals)")
        parents = tuple(parents)
        for p in parents:
            if not isinstance(p, ParentView):
                raise TypeError(f"parents must be ParentView records, got {type(p).__name__}")
        context = context if context is not None else OperatorContext()
        if n == 0:
            return []
        try:
            out = list(self._propose(parents, shape, rng, n, context))
        except Exception as exc:  # a bug or a broken dependency: counted, never fatal
            out = [self.failure(f"{OPERATOR_ERROR}{type(exc).__name__}: {exc}", parents)]
        return out[:n]

    @abc.abstractmethod
    def _propose(self, parents: tuple[ParentView, ...], shape: Shape, rng: random.Random, n: int,
                 context: OperatorContext) -> list[Proposal]:
        """The operator itself; may return fewer than ``n`` proposals, each a candidate or a failure."""

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        """Learn the outcome of a proposed (or any) candidate. Stateless operators ignore it."""

    # -- helpers for implementations -------------------------------------------------------------
    def failure(self, reason: str, parents: Iterable[ParentView] = ()) -> Proposal:
        return Proposal(operator=self.name, reason=reason, parents=tuple(p.id for p in parents))

    def build(self, template: Template, knobs: Mapping[str, Any], shape: Shape, parents: Sequence[ParentView],
              *, specialize: bool = False, generation: int = 0, meta: Optional[Mapping[str, Any]] = None) -> Proposal:
        """A proposal from ``knobs`` via :meth:`Template.candidate`, or a failure when it does not render."""
        try:
            cand = template.candidate(knobs, shape, specialize, operator=self.name,
                                      parents=tuple(p.id for p in parents), generation=generation,
                                      meta=dict(meta or {}))
        except (TemplateError, ValueError) as exc:
            return self.failure(f"template {template.name} does not render: {exc}", parents)
        return Proposal(operator=self.name, candidate=cand, parents=cand.parents)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r}, arity={self.arity})"
