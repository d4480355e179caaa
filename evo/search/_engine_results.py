"""The engine's recording half: what happens when the pool hands results back.

Each evaluation gets its roofline fraction (under the archive's calibration), is archived, and
feeds the shape's population, budget, convergence, stall detection and progress; the operator
that proposed it is told, the chooser rewarded; then the archive is committed (fsync) and the
hooks (``evo run --rl-every``) run. A mixin of :class:`evo.search._engine.Engine`, whose state it shares.
"""
from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from populations import Archive, Calibration, Candidate, Evaluation, Shape, Status, disqualifies, roofline_frac
from operators import Operator
from evaluators import buffers_warning

from ._budget import Budget, Convergence, gpu_seconds
from ._config import RunConfig
from ._opbandit import OperatorBandit, OperatorChooser, child_gain
from ._progress import EventLog, Progress
from ._selection import Population

__all__ = ["InFlight", "Recording"]


@dataclass
class InFlight:
    """A candidate in flight: for which shape, from which operator, since when."""

    candidate: Candidate
    shape: Shape
    operator: str
    submitted: float



class Recording:
    """Result methods of the engine (its state is set up by ``Engine.__init__``)."""

    config: RunConfig
    archive: Archive
    clock: Callable[[], float]
    calibration: Calibration
    events: EventLog
    progress: Progress
    budget: Budget
    chooser: "OperatorChooser | OperatorBandit"
    operators: dict[str, Operator]
    populations: dict[Shape, Population]
    conv: dict[Shape, Convergence]
    stall: dict[Shape, Convergence]
    best_time: dict[Shape, Optional[float]]
    fitness_of: dict[Shape, dict[str, Optional[float]]]
    history: dict[Shape, list[tuple[Candidate, Evaluation]]]
    known: dict[Shape, set[str]]
    inflight: dict[Future, InFlight]
    converged: set[Shape]
    hooks: list[Callable[[Any], None]]
    errors_in_a_row: int
    #: the worker buffer warning is said once a run (a ``warning`` event and a progress line)
    warned_buffers: bool = False

    # -- results -------------------------------------------------------------------------------
    def _collect(self, done: set[Future]) -> None:
        for fut in done:
            job = self.inflight.pop(fut, None)
            if job is None:
                continue
            try:
                evals = list(fut.result())
            except Exception as exc:  # the pool failed this job: record it, do not stop the run
                evals = []
                message = f"evaluator pool failed: {type(exc).__name__}: {exc}"
            else:
                message = "evaluator pool returned no evaluation for this shape"
            if not any(e.shape == job.shape for e in evals):
                evals.append(Evaluation(job.candidate.id, job.shape, Status.RUNTIME_ERROR, message=message))
            evals = [self._with_roofline(ev) for ev in evals]
            self.budget.charge(evals)
            for ev in evals:
                self._warn_buffers(ev)
                self.errors_in_a_row = self.errors_in_a_row + 1 if ev.status is Status.RUNTIME_ERROR else 0
                self.archive.add(ev)
                if ev.shape in self.populations:  # a candidate claiming several shapes is measured at each
                    self.known[ev.shape].add(ev.candidate_id)
                    self._record(job, ev)
            self._tell(job, evals)
        self.archive.commit()
        for hook in list(self.hooks):
            try:
                hook(self)
            except Exception as exc:
                self.hooks.remove(hook)
                self.events.emit("hook_failed", None, hook=repr(hook), error=f"{type(exc).__name__}: {exc}")

    def _warn_buffers(self, ev: Evaluation) -> None:
        """Say once, loudly, that a worker checks in plain allocations (the driver refused VA
        reservations): the run goes on, but its out-of-bounds checks are weaker."""
        why = None if self.warned_buffers else buffers_warning(ev.provenance or {})
        if why:
            self.warned_buffers = True
            self.events.emit("warning", ev.shape, what="buffers", message=why)
            self.progress.message(f"evo: WARNING: {why}")

    def _with_roofline(self, ev: Evaluation) -> Evaluation:
        """``ev`` with its roofline fraction recorded (device-timer median against
        ``populations.roofline_time`` under this archive's calibration), where it has a timer."""
        t = ev.timers.get("device")
        if ev.roofline_frac is not None or t is None:
            return ev
        frac = roofline_frac(ev.shape, t.median, self.calibration)
        return ev if frac is None else replace(ev, roofline_frac=frac)

    def _record(self, job: InFlight, ev: Evaluation) -> None:
        shape = ev.shape
        before = self.populations[shape].best
        improved = self._observe(shape, job.candidate, ev)
        stats = self.progress.stats[shape]
        stats.evals += 1
        stats.gpu_s += gpu_seconds(ev)
        stats.statuses[ev.status.value] += 1
        self.events.emit("evaluation", shape, candidate=ev.candidate_id, status=ev.status.value,
                         fitness=ev.fitness, operator=job.operator, gpu_s=round(gpu_seconds(ev), 6),
                         roofline_frac=None if ev.roofline_frac is None else round(ev.roofline_frac, 4),
                         latency_s=round(self.clock() - job.submitted, 6))
        self.chooser.reward(job.operator, improved)
        if isinstance(self.chooser, OperatorBandit) and job.operator in self.operators:
            # a parentless proposal (Optuna's samples) is measured against the shape's incumbent
            fits = [self.fitness_of[shape].get(p) for p in job.candidate.parents] or [before and before.fitness]
            parent = max((f for f in fits if f is not None), default=None)
            self.chooser.observe(job.operator, child_gain(ev.fitness if not ev.flags else None, parent),
                                 gpu_seconds(ev), job.candidate.adapter or "" if job.candidate.model else None)
        if improved:
            stats.best = ev.fitness
            self.events.emit("new_best", shape, candidate=ev.candidate_id, fitness=ev.fitness,
                             previous=before.fitness if before else None, operator=job.operator)
            self.progress.message(f"evo: {shape} new best {ev.fitness:.3f}x ({job.operator}, {ev.candidate_id})")
        if shape not in self.converged and self.conv[shape].converged:
            self.converged.add(shape)
            stats.converged = True
            self.events.emit("converged", shape, best=self.conv[shape].best, window=self.config.converge_window)

    def _observe(self, shape: Shape, cand: Candidate, ev: Evaluation) -> bool:
        """Feed one evaluation to the shape's population and convergence; True on a new best."""
        population = self.populations[shape]
        self.history[shape].append((cand, ev))
        self.fitness_of[shape][cand.id] = None if ev.flags else ev.fitness
        if disqualifies(ev.status, bool(ev.flags)):
            population.ban(cand.id)
        before = population.best
        population.add(cand, ev)
        self.conv[shape].observe(ev.fitness)
        self.stall[shape].observe(ev.fitness)
        t = ev.timers.get("device")
        if ev.fitness is not None and t is not None and t.median > 0:
            best = self.best_time[shape]
            self.best_time[shape] = t.median if best is None else min(best, t.median)
        after = population.best
        return after is not None and (before is None or after.fitness > before.fitness)

    def _tell(self, job: InFlight, evals: list[Evaluation]) -> None:
        op = self.operators.get(job.operator)
        if op is not None:
            for ev in evals:
                op.tell(job.candidate, ev)

