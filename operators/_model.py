"""Operators backed by a model: the members only they have, and the engine's one way to read them.

A plain :class:`~._base.Operator` answers at once from the CPU. A :class:`ModelOperator` calls a
model (the LLM operators, a ranker whose cost model is a language model): its calls may take
seconds (``asynchronous``, ``concurrency``), it makes several children for about the price of
one (``batch``), it spends tokens and GPU seconds the run's budgets charge (``take_*``), loads
its model before the run (``warm``), stops when asked (``cancel``) and counts outcomes per model
(``outcomes``).

Callers that hold operators of either kind read these members through :func:`model_face`
(the operator itself when it is a ModelOperator, else the defaults of one that calls no model)
or :func:`model_usage` (what it spent since the last call), so the isinstance check is here,
in one place.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ._base import Operator

__all__ = ["ModelFace", "ModelOperator", "ModelUsage", "model_face", "model_usage"]


class ModelFace:
    """The model-backed members, with the defaults of an operator that calls no model."""

    #: True: a call takes seconds (a model), so the engine runs ``propose`` on a thread.
    asynchronous: bool = False
    #: How many ``propose`` calls of an asynchronous operator may run at once.
    concurrency: int = 1
    #: Proposals the engine asks of one ``propose`` call at least (its ``n`` is the larger of
    #: this and the run's ``batch``): an operator that makes several children for about the price
    #: of one (the LLM operator's batched sampling) says how many here.
    batch: int = 1
    #: Per-model outcome counts (the run's ``stop`` event reports them); None: nothing to report.
    outcomes: Optional[Mapping[str, Mapping[str, Any]]] = None

    def cancel(self) -> None:
        """Ask running ``propose`` calls to return soon (a stopping run). Default: nothing to stop."""

    def take_tokens(self) -> Optional[int]:
        """Model tokens spent since the last call, failed calls included (the run's token budget).
        Default None: the operator does not count them, and the engine sums the ``tokens`` its
        candidates record in ``meta``."""
        return None

    def take_gpu_seconds(self) -> float:
        """Seconds a model of this operator held a GPU since the last call (its cost: the run's
        GPU budget and the operator bandit count them). Default 0.0."""
        return 0.0

    def take_gpu_wait_seconds(self) -> float:
        """Seconds a model of this operator waited for a shared GPU since the last call (reported
        beside the held seconds, charged to no one). Default 0.0."""
        return 0.0

    def warm(self) -> dict[str, str]:
        """Load and warm whatever the operator needs before a run's budget clock starts, so the
        first proposal costs what the others do; per model, ``ready`` or why not. Default: nothing
        to load (an empty mapping), and the run records no ``llm_warm`` event for it."""
        return {}


class ModelOperator(Operator, ModelFace):
    """Base of the operators that call a model (see the module docstring); subclasses override
    the members of :class:`ModelFace` that apply to them."""


#: The face of every operator that calls no model: the defaults, shared (it holds no state).
_NO_MODEL = ModelFace()


def model_face(op: Operator) -> ModelFace:
    """``op``'s model-backed members: ``op`` itself when it is a :class:`ModelOperator`, else the
    defaults (synchronous, batch 1, nothing spent, nothing to warm or cancel)."""
    return op if isinstance(op, ModelOperator) else _NO_MODEL


@dataclass(frozen=True)
class ModelUsage:
    """What an operator's models spent since the last look: tokens (None: not counted by the
    operator), GPU seconds held (charged) and waited for a lease (reported only)."""

    tokens: Optional[int] = None
    gpu_s: float = 0.0
    gpu_wait_s: float = 0.0


def model_usage(op: Operator) -> ModelUsage:
    """Take ``op``'s spending since the last call (its counters restart); zeros for an operator
    that calls no model."""
    face = model_face(op)
    return ModelUsage(face.take_tokens(), float(face.take_gpu_seconds()), float(face.take_gpu_wait_seconds()))
