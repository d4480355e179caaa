"""The engine's recording half: what happens when the pool hands results back.

The :class:`Recorder` turns each finished future into a :class:`Measured` (a failed future or a
missing shape becomes a runtime error, every evaluation gets its roofline fraction under the
archive's calibration), charges the budget, counts runtime errors in a row and says once if a
worker checks in plain allocations. As one of the engine's measure callbacks (``_callbacks.py``)
it then feeds each evaluation to its shape's :class:`ShapeState` (population, convergence, stall
detection), progress and events, and tells the chooser; the archive write and ``Operator.tell``
are its peers in that list. It is a collaborator of :class:`evo.search._engine.Engine`, handed
the run's services; its own state is the error streak and the buffer warning's flag.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import Sequence

from populations import Evaluation, Status, roofline_frac
from evaluators import buffers_warning

from ._budget import gpu_seconds
from ._callbacks import InFlight, Measured, MeasureCallback
from ._opbandit import child_gain
from ._services import EngineServices
from ._shape_state import ShapeState

__all__ = ["Recorder"]


class Recorder(MeasureCallback):
    """See the module docstring."""

    essential = True

    def __init__(self, services: EngineServices) -> None:
        self.services = services
        #: runtime errors in a row, all shapes: a dead pool, not bad kernels
        self.errors_in_a_row = 0
        #: the worker buffer warning is said once a run (a ``warning`` event and a progress line)
        self.warned_buffers = False

    # -- before the callbacks ------------------------------------------------------------------
    def measured(self, job: InFlight, fut: Future) -> Measured:
        """The finished ``fut``'s evaluations of ``job`` (a pool failure is recorded, not raised)."""
        try:
            evals = list(fut.result())
        except Exception as exc:  # the pool failed this job: record it, do not stop the run
            evals = []
            message = f"evaluator pool failed: {type(exc).__name__}: {exc}"
        else:
            message = "evaluator pool returned no evaluation for this shape"
        if not any(e.shape == job.shape for e in evals):
            evals.append(Evaluation(job.candidate.id, job.shape, Status.RUNTIME_ERROR, message=message))
        return Measured(job, [self._with_roofline(ev) for ev in evals])

    def account(self, results: Sequence[Measured]) -> None:
        """Charge the budget, count runtime errors in a row, warn about plain buffers (once)."""
        for measured in results:
            self.services.budget.charge(measured.evaluations)
            for ev in measured.evaluations:
                self._warn_buffers(ev)
                self.errors_in_a_row = self.errors_in_a_row + 1 if ev.status is Status.RUNTIME_ERROR else 0

    def _warn_buffers(self, ev: Evaluation) -> None:
        """Say once, loudly, that a worker checks in plain allocations (the driver refused VA
        reservations): the run goes on, but its out-of-bounds checks are weaker."""
        why = None if self.warned_buffers else buffers_warning(ev.provenance or {})
        if why:
            self.warned_buffers = True
            self.services.events.emit("warning", ev.shape, what="buffers", message=why)
            self.services.progress.message(f"evo: WARNING: {why}")

    def _with_roofline(self, ev: Evaluation) -> Evaluation:
        """``ev`` with its roofline fraction recorded (device-timer median against
        ``populations.roofline_time`` under this archive's calibration), where it has a timer."""
        t = ev.timers.get("device")
        if ev.roofline_frac is not None or t is None:
            return ev
        frac = roofline_frac(ev.shape, t.median, self.services.calibration)
        return ev if frac is None else replace(ev, roofline_frac=frac)

    # -- the population update (a measure callback) --------------------------------------------
    def apply(self, services: EngineServices, results: Sequence[Measured]) -> None:
        """Record each evaluation at its shape, where this run evolves that shape (a candidate
        claiming several shapes is measured at each)."""
        for measured in results:
            for ev in measured.evaluations:
                state = services.states.get(ev.shape)
                if state is not None:
                    state.known.add(ev.candidate_id)
                    self.record(state, measured.job, ev)

    def record(self, state: ShapeState, job: InFlight, ev: Evaluation) -> None:
        """One evaluation at ``state``'s shape: population, progress, events, the chooser, convergence."""
        s = self.services
        shape = state.shape
        before = state.population.best
        improved = state.observe(job.candidate, ev)
        stats = s.progress.stats[shape]
        stats.evals += 1
        stats.gpu_s += gpu_seconds(ev)
        stats.statuses[ev.status.value] += 1
        s.events.emit("evaluation", shape, candidate=ev.candidate_id, status=ev.status.value,
                      fitness=ev.fitness, operator=job.operator, gpu_s=round(gpu_seconds(ev), 6),
                      roofline_frac=None if ev.roofline_frac is None else round(ev.roofline_frac, 4),
                      latency_s=round(s.clock() - job.submitted, 6))
        s.chooser.reward(job.operator, improved)
        if job.operator in s.operators:
            # a parentless proposal (Optuna's samples) is measured against the shape's incumbent
            fits = [state.fitness_of.get(p) for p in job.candidate.parents] or [before and before.fitness]
            parent = max((f for f in fits if f is not None), default=None)
            s.chooser.observe(job.operator, child_gain(ev.fitness if not ev.flags else None, parent),
                              gpu_seconds(ev), job.candidate.adapter or "" if job.candidate.model else None)
        if improved:
            stats.best = ev.fitness
            s.events.emit("new_best", shape, candidate=ev.candidate_id, fitness=ev.fitness,
                          previous=before.fitness if before else None, operator=job.operator)
            s.progress.message(f"evo: {shape} new best {ev.fitness:.3f}x ({job.operator}, {ev.candidate_id})")
        if not state.converged and state.conv.converged:
            state.converged = True
            stats.converged = True
            s.events.emit("converged", shape, best=state.conv.best, window=s.config.converge_window)
