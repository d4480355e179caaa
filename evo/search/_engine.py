"""The evolution engine: per-shape populations fed through an asynchronous evaluator pool.

One loop, on one thread, drives everything; the pool does the parallel work (compiling on CPU
processes while its GPU workers time other candidates). The engine keeps up to
``max_inflight`` candidates submitted (by default 2 x GPUs + compile workers, so the GPUs never
wait on a compile) and proposes a new one each time a result arrives:

1. pick an active shape by headroom (``_budget.shape_weights`` / ``pick_shape``: weighted fair
   sharing of the evaluations, finished + in flight, by each shape's distance from its roofline;
   a shape at >= 0.9 of it, or stalled, yields its slots; with ``[allocation] enabled = false``
   the shape with the fewest evaluations); the pool is told the weights before each fill
   (``set_shape_weights``: RayPool shards shapes across its GPU actors by them),
2. take its next queued candidate (transferred elites of nearby shapes, then the templates'
   heuristic picks and spread-out samples of ``evo seed``, or candidates that a killed run or
   ``evo seed`` left unevaluated), or else draw parents from its population and ask
   an operator (chosen by weight) to propose,
3. skip candidates whose id was already evaluated at the shape or is in flight (de-duplication
   by content hash against the archive), add the candidate to the archive, submit it,
4. when futures finish: record each evaluation's roofline fraction (``roofline_frac``, with
   the archive's calibration) and charge the budget, then apply the measure callbacks
   (``Engine.callbacks``, ``_callbacks.py``) in order to the batch: archive and commit (fsync:
   a SIGKILL loses at most the candidates in flight), update population, convergence and
   progress, ``tell`` the operators, then any a caller appended (``--rl-every``'s RL updater).

Slow operators (those with ``asynchronous = True``: the LLM ones, 1-4 s a call on CPU) propose
on threads instead (at most ``concurrency`` calls per operator, default 1, and one per
shape): while a call runs the step takes the next operator in its drawn order, and the finished
proposals join the shape's queue. Parents, history and a child random generator are taken on
the loop's thread, so the loop's own random stream does not depend on thread timing.

Stopping: a budget reached, every shape converged, nothing left to propose, or an interrupt.
The token budget (``max_tokens``) first switches off only the operators that spend tokens
(finished LLM answers still go to the GPU); the run stops with ``tokens`` when no other
operator is left.
Every stop but a second interrupt lets in-flight work finish (at most ``pool.drain_s`` seconds);
a second interrupt abandons it. Either way the archive is committed before :meth:`Engine.run`
returns.

This module holds the loop, stopping and submission. What the engine knows about a shape is one
:class:`~evo.search._shape_state.ShapeState` (``Engine.states``). Its collaborators are handed the
run's services (``_services.py``) and the record they act on: start-up (``_startup.py``), the
allocator (step 1, ``_allocation.py``), the :class:`Proposer` (steps 2-3, ``_engine_propose.py``)
with the operator chooser (``_chooser.py``: weights, or the bandit of ``_opbandit.py``), and the
:class:`Recorder` (step 4, ``_engine_results.py``).
"""
from __future__ import annotations

import random
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from populations import Archive, Calibration, Candidate, Shape, Template
from operators import Operator, model_face
from evaluators import EliteThreshold

from ._allocation import make_allocator
from ._budget import Budget
from ._calibration import load_calibration
from ._callbacks import ArchiveResults, InFlight, MeasureCallback, TellOperators, apply_callbacks
from ._chooser import OperatorChooser, WeightedChooser
from ._config import RunConfig
from ._engine_propose import Proposer
from ._engine_results import Recorder
from ._opbandit import OperatorBandit
from ._progress import EventLog, Progress
from ._services import EngineServices
from ._shape_state import ShapeState
from ._startup import prepare_states

if TYPE_CHECKING:  # the engine needs only the interface; evaluators is imported where a pool is made
    from evaluators import EvaluatorPool

__all__ = ["Engine", "RunResult", "pool_gpus"]


@dataclass
class RunResult:
    """How a run ended: ``reason`` is evals | wall | gpu_seconds | tokens | converged |
    exhausted | pool_failing | interrupted | abandoned."""

    reason: str
    evaluations: int
    lost: int                      # in-flight candidates abandoned without a result
    best: dict[str, Optional[float]] = field(default_factory=dict)
    budget: dict[str, float] = field(default_factory=dict)



def pool_gpus(pool: "EvaluatorPool", config: RunConfig) -> int:
    """How many GPUs the pool times on: the configured list, else what the pool says it has."""
    return len(config.pool.gpus) or len(pool.gpus) or 1


class Engine:
    """Runs the search over ``config.shapes``; see the module docstring."""

    #: Seconds the loop waits for a result before it looks at budgets and interrupts again.
    TICK = 0.2
    #: Fruitless proposal rounds (failures, duplicates) in a row before a fill gives up on a shape.
    MAX_MISSES = 32

    def __init__(self, config: RunConfig, archive: Archive, pool: "EvaluatorPool",
                 operators: Mapping[str, Operator], templates: Mapping[str, Template], *,
                 events: EventLog, progress: Optional[Progress] = None,
                 clock: Callable[[], float] = time.monotonic, calibration: Optional[Calibration] = None) -> None:
        self.config = config
        self.archive = archive
        self.pool = pool
        self.operators = dict(operators)
        self.templates = dict(templates)
        self.events = events
        self.progress = progress or Progress(config.shapes, pool_gpus(pool, config), mode="none")
        self.clock = clock
        arch = config.pool.arch
        #: the target GPU: configured, else what the pool reports (LocalPool asks nvidia-smi)
        self.arch = str(pool.arch or "sm_90a") if arch == "auto" else arch
        self.max_inflight = config.pool.inflight(pool_gpus(pool, config))
        self.rng = random.Random(config.seed)
        self.budget = Budget(config.budget_s, config.gpu_seconds, config.max_evals, config.max_tokens, clock=clock)
        self.chooser: OperatorChooser = (OperatorBandit(config.operators, config.bandit) if config.bandit.enabled
                                         else WeightedChooser(config.operators))
        families = {name: t.family for name, t in self.templates.items()}
        #: one record per shape: population, convergence, stall, best time, queue, known ids, history
        self.states: dict[Shape, ShapeState] = {s: ShapeState.start(s, config, families) for s in config.shapes}
        #: the device's ceilings (calibration.json beside the archive, else the H200 defaults)
        self.calibration = calibration or load_calibration(getattr(archive, "path", None))
        self.services = EngineServices(config, archive, events, self.progress, self.budget, self.chooser,
                                       self.operators, self.templates, self.rng, self.arch, clock, self.calibration,
                                       self.states)
        self.allocator = make_allocator(self.services)
        self.proposer = Proposer(self.services)
        self.recorder = Recorder(self.services)
        #: applied in order after each batch of results (``_callbacks.py``): archive and commit,
        #: record, tell the operators; ``evo run --rl-every`` appends its RL updater, which so runs
        #: on results archived and committed; a non-essential callback that raises is reported as
        #: an event and dropped, never the end of the run
        self.callbacks: list[MeasureCallback] = [ArchiveResults(), self.recorder, TellOperators()]
        self.inflight: dict[Future, InFlight] = {}
        self.interrupts = 0
        self.lost = 0  # in-flight candidates abandoned without a result

    # -- interrupts (called from a signal handler: only set a flag) ---------------------------
    def interrupt(self) -> None:
        """First call: finish in-flight work and stop; second: abandon it and stop."""
        self.interrupts += 1

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> RunResult:
        cfg = self.config
        self.events.emit("start", None, shapes=[str(s) for s in cfg.shapes], operators=cfg.operators,
                         seed=cfg.seed, inflight=self.max_inflight, arch=self.arch,
                         limits={"wall_s": cfg.budget_s, "gpu_s": cfg.gpu_seconds, "evals": cfg.max_evals,
                                 "tokens": cfg.max_tokens})
        reason: Optional[str] = None
        deadline: Optional[float] = None
        try:
            with self.progress:
                self.progress.message(
                    f"evo: {len(cfg.shapes)} shape(s) on {self.arch}, up to {self.max_inflight} candidates in flight, "
                    f"operators {', '.join(f'{k}:{v:g}' for k, v in cfg.operators.items())}; "
                    f"events in {self.events.path}")
                self._prepare()
                while True:
                    if self.interrupts >= 2:
                        reason = "abandoned"
                        self._abandon(reason)
                        break
                    if reason is None:
                        reason = self._why_stop()
                        if reason is not None:
                            deadline = self.clock() + cfg.pool.drain_s
                            self._announce(reason)
                    if reason is None:
                        self._fill()
                        if not self.inflight and not self.proposer.running:
                            reason = "exhausted"
                            self._announce(reason)
                    if not self.inflight and (reason is not None or not self.proposer.running):
                        break
                    if deadline is not None and self.clock() >= deadline:
                        self._abandon(reason or "drain_timeout")
                        break
                    done, _ = wait([*self.inflight, *self.proposer.running], timeout=self.TICK,
                                   return_when=FIRST_COMPLETED)
                    if done:
                        self.proposer.collect({f for f in done if f in self.proposer.running})
                        self._collect({f for f in done if f in self.inflight})
                    self.progress.update()
        finally:
            self.proposer.stop()
            self.archive.commit()
            result = RunResult(reason or "error", self.budget.used_evals, self.lost,
                               {str(s): st.population.best.fitness if st.population.best else None
                                for s, st in self.states.items()},
                               self.budget.summary())
            self.events.emit("stop", None, reason=result.reason, evaluations=result.evaluations, lost=self.lost,
                             best=result.best, budget=result.budget, duplicates=self.proposer.duplicates,
                             proposal_failures={f"{op}: {why}": n for (op, why), n in self.proposer.failures.items()},
                             models={name: {m: dict(c) for m, c in model_face(op).outcomes.items()}
                                     for name, op in self.operators.items() if model_face(op).outcomes is not None},
                             bandit=self.chooser.summary())
        return result

    def _why_stop(self) -> Optional[str]:
        if self.interrupts:
            return "interrupted"
        exhausted = self.budget.exhausted()
        if exhausted == "tokens":
            exhausted = self.proposer.tokens_spent()
        if exhausted:
            return exhausted
        if all(st.converged for st in self.states.values()):
            return "converged"
        limit = self.config.pool.max_consecutive_errors
        if limit and self.recorder.errors_in_a_row >= limit:
            return "pool_failing"
        return None

    def _announce(self, reason: str) -> None:
        if reason == "interrupted":
            self.events.emit("interrupt", None, inflight=len(self.inflight))
            self.progress.message(f"evo: interrupted; finishing {len(self.inflight)} in-flight candidate(s) "
                                  f"(at most {self.config.pool.drain_s:.0f}s; interrupt again to abandon them)")
        elif reason in ("wall", "gpu_seconds", "evals", "tokens"):
            self.events.emit("budget_stop", None, budget=reason, used=self.budget.summary(),
                             inflight=len(self.inflight))
            self.progress.message(f"evo: {reason} budget reached; finishing {len(self.inflight)} in-flight candidate(s)")
        elif reason == "pool_failing":
            self.progress.message(f"evo: {self.recorder.errors_in_a_row} runtime errors in a row: the evaluator pool looks "
                                  "broken (see the messages in the archive); stopping")
        else:
            self.progress.message(f"evo: stopping ({reason})")

    def _abandon(self, reason: str) -> None:
        """Give up on in-flight work: cancel what can be cancelled and tell the pool to stop."""
        lost = len(self.inflight)
        self.lost += lost
        for fut in self.inflight:
            fut.cancel()
        self.events.emit("abandon", None, reason=reason, lost=lost,
                         candidates=[j.candidate.id for j in self.inflight.values()])
        self.inflight.clear()
        self.pool.cancel_all()

    # -- start-up: rebuild from the archive, queue seeds (``_startup.py``) ----------------------
    def _prepare(self) -> None:
        prepare_states(self.services)

    # -- allocation and submission -------------------------------------------------------------
    def _active(self) -> list[Shape]:
        return [s for s, st in self.states.items() if not st.converged]

    def _load(self, shape: Shape) -> int:
        return self.states[shape].population.evaluated + sum(1 for j in self.inflight.values() if j.shape == shape)

    def _fill(self) -> None:
        """Submit candidates until the in-flight bound (or the evaluation budget) is reached.

        A shape whose operators come back empty (failures, duplicates) ``MAX_MISSES`` times in
        a row is left alone until the next fill; when every shape is, nothing is submitted."""
        misses: Counter = Counter()
        if len(self.inflight) < self.max_inflight and self._active():
            # where the evaluations will go, so that a pool of several GPUs can shard by it
            self.pool.set_shape_weights(self.weights(self._active()))
        while len(self.inflight) < self.max_inflight:
            left = self.budget.remaining_evals(len(self.inflight))
            if left is not None and left <= 0:
                return
            shapes = [s for s in self._active() if misses[s] < self.MAX_MISSES]
            if not shapes:
                return
            shape = self._pick(shapes)
            got = self.proposer.next(self.states[shape])
            if got is None:
                misses[shape] += 1
                continue
            misses[shape] = 0
            self._submit(got[0], shape, got[1])

    def stalled(self, shape: Shape) -> bool:
        """The shape stopped improving (``ShapeState.stalled`` over ``[allocation] stall_window``)."""
        return self.states[shape].stalled(self.config.allocation.stall_window)

    def weights(self, shapes: list[Shape]) -> dict[Shape, float]:
        """Allocation weights of ``shapes`` (see evo/search/_allocation.py)."""
        return self.allocator.weights([self.states[s] for s in shapes])

    def _pick(self, shapes: list[Shape]) -> Shape:
        """The shape that gets the next proposal slot (the allocator's pick)."""
        order = [st for s, st in self.states.items() if s in shapes]
        return self.allocator.pick(order, {st.shape: self._load(st.shape) for st in order})

    #: The elite threshold sent with a job is this share of the current elite cutoff (a removed
    #: elite can lower the cutoff a little).
    ELITE_MARGIN = 0.95

    def _elite_threshold(self, shape: Shape) -> Optional[float]:
        """The speedup a new candidate must reach to join ``shape``'s elites now (None while the
        elite set is not full); the evaluator skips its memoisation timing pass below it."""
        return self.states[shape].elite_threshold(self.ELITE_MARGIN)

    def _elite_thresholds(self, cand: Candidate, shape: Shape) -> EliteThreshold:
        """What a job carries: ``shape``'s threshold for a candidate that claims one shape; for
        one that claims several, each claimed shape's own (None for a shape this run does not
        evolve), since it can become an elite at any of them and the memo pass and host timers
        must not be skipped there on the proposing shape's cutoff."""
        if len(cand.shapes) <= 1:
            return self._elite_threshold(shape)
        return {str(s): self._elite_threshold(s) if s in self.states else None for s in cand.shapes}

    def _submit(self, cand: Candidate, shape: Shape, op: str) -> None:
        self.archive.add(cand)
        fut = self.pool.submit(cand, elite_threshold=self._elite_thresholds(cand, shape))
        self.inflight[fut] = InFlight(cand, shape, op, self.clock())
        self.states[shape].known.add(cand.id)
        self.events.emit("proposal", shape, candidate=cand.id, operator=op, template=cand.template,
                         knobs=dict(cand.knobs) if cand.knobs is not None else None, parents=list(cand.parents))

    # -- results ---------------------------------------------------------------------------------
    def _collect(self, done: set[Future]) -> None:
        """The finished jobs of ``done``, accounted, then through the measure callbacks in order."""
        results = []
        for fut in done:
            job = self.inflight.pop(fut, None)
            if job is not None:
                results.append(self.recorder.measured(job, fut))
        self.recorder.account(results)
        apply_callbacks(self.callbacks, self.services, results, self.events)
