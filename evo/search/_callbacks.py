"""Measure callbacks: what happens, in order, after each batch of results (after TVM
MetaSchedule's ``MeasureCallback``).

When futures finish, the recorder turns each into a :class:`Measured` (the job and its
evaluations, roofline fractions recorded, the budget charged); then the engine applies its
callbacks in list order, each to the whole batch: by default :class:`ArchiveResults` (append to
the archive and commit, fsync), the recorder (population, convergence, progress, events, the
chooser) and :class:`TellOperators` (``Operator.tell``). Others are appended after them
(``evo run --rl-every`` appends its RL updater), so they run on a batch that is archived,
committed and recorded. A callback that is not ``essential`` and raises is reported as a
``hook_failed`` event and dropped for the rest of the run, never the end of it; an essential
one's error ends the run (a run that cannot archive or record must not go on).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Sequence

from populations import Candidate, Evaluation, Shape

from ._progress import EventLog
from ._services import EngineServices

__all__ = ["InFlight", "Measured", "MeasureCallback", "ArchiveResults", "TellOperators", "apply_callbacks"]


@dataclass
class InFlight:
    """A candidate in flight: for which shape, from which operator, since when."""

    candidate: Candidate
    shape: Shape
    operator: str
    submitted: float


@dataclass
class Measured:
    """One finished job: the candidate in flight and its evaluations (one per claimed shape)."""

    job: InFlight
    evaluations: list[Evaluation] = field(default_factory=list)


class MeasureCallback(ABC):
    """A step applied after each batch of results, on the engine's thread."""

    #: True: an error ends the run; False: the callback is reported and dropped instead.
    essential: bool = False

    @abstractmethod
    def apply(self, services: EngineServices, results: Sequence[Measured]) -> None:
        """Act on one batch of results (possibly empty: a batch whose futures all vanished)."""


class ArchiveResults(MeasureCallback):
    """Append every evaluation to the archive, then commit (fsync): a SIGKILL loses at most the
    candidates still in flight."""

    essential = True

    def apply(self, services: EngineServices, results: Sequence[Measured]) -> None:
        for measured in results:
            for ev in measured.evaluations:
                services.archive.add(ev)
        services.archive.commit()


class TellOperators(MeasureCallback):
    """Tell the operator that proposed each candidate its evaluations (``Operator.tell``)."""

    essential = True

    def apply(self, services: EngineServices, results: Sequence[Measured]) -> None:
        for measured in results:
            op = services.operators.get(measured.job.operator)
            if op is not None:
                for ev in measured.evaluations:
                    op.tell(measured.job.candidate, ev)


def apply_callbacks(callbacks: list[MeasureCallback], services: EngineServices, results: Sequence[Measured],
                    events: EventLog) -> None:
    """Apply ``callbacks`` in order; a non-essential one that raises is removed from the list
    and reported as a ``hook_failed`` event."""
    for callback in list(callbacks):
        try:
            callback.apply(services, results)
        except Exception as exc:
            if callback.essential:
                raise
            callbacks.remove(callback)
            events.emit("hook_failed", None, hook=repr(callback), error=f"{type(exc).__name__}: {exc}")
