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
   the archive's calibration), archive it, update population, budget, convergence and
   progress, ``tell`` the operator, and commit (fsync) the archive, so a SIGKILL loses at
   most the candidates in flight.

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

This module holds the loop, start-up and allocation; steps 2-3's proposing is
``evo/search/_engine_propose.py`` and step 4's recording ``evo/search/_engine_results.py`` (mixins of
:class:`Engine`, sharing its state).
"""
from __future__ import annotations

import random
import time
from collections import Counter, deque
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from populations import Archive, Calibration, Candidate, Evaluation, Shape, Template, attainable_frac
from operators import Operator, model_face
from evaluators import EliteThreshold

from ._budget import Budget, Convergence, pick_shape, shape_weights
from ._calibration import load_calibration
from ._config import RunConfig
from ._engine_propose import Proposing
from ._engine_results import Recording, InFlight
from ._opbandit import OperatorBandit, OperatorChooser
from ._progress import EventLog, Progress
from ._seeding import seed_population
from ._selection import Population
from ._transfer import transfer_candidates

if TYPE_CHECKING:  # the engine needs only the interface; evaluators is imported where a pool is made
    from evaluators import EvaluatorPool

__all__ = ["Engine", "RunResult", "OperatorChooser", "pool_gpus"]


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


class Engine(Proposing, Recording):
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
        self.chooser = (OperatorBandit(config.operators, config.bandit) if config.bandit.enabled
                        else OperatorChooser(config.operators))
        self.fitness_of: dict[Shape, dict[str, Optional[float]]] = {s: {} for s in config.shapes}  # latest per id
        families = {name: t.family for name, t in self.templates.items()}
        sel = config.selection
        self.populations = {s: Population(sel.elites, sel.cells, sel.register_bucket, families, sel.population)
                     for s in config.shapes}
        self.conv = {s: Convergence(config.converge_window, config.converge_threshold) for s in config.shapes}
        alloc = config.allocation
        #: the device's ceilings (calibration.json beside the archive, else the H200 defaults)
        self.calibration = calibration or load_calibration(getattr(archive, "path", None))
        #: per shape: no improvement over the last ``stall_window`` evaluations (it then yields its slots)
        self.stall = {s: Convergence(alloc.stall_window or None, alloc.stall_threshold) for s in config.shapes}
        self.best_time: dict[Shape, Optional[float]] = {s: None for s in config.shapes}  # fastest ok device median
        self.yielded: set[Shape] = set()  # shapes whose allocation weight is 0 (announced once each)
        self.queue: dict[Shape, deque[tuple[Candidate, str]]] = {s: deque() for s in config.shapes}
        self.known: dict[Shape, set[str]] = {s: set() for s in config.shapes}
        self.inflight: dict[Future, InFlight] = {}
        self.converged: set[Shape] = set()
        self.history: dict[Shape, list[tuple[Candidate, Evaluation]]] = {s: [] for s in config.shapes}
        self.interrupts = 0
        self.lost = 0  # in-flight candidates abandoned without a result
        self.errors_in_a_row = 0  # runtime errors in a row, all shapes: a dead pool, not bad kernels
        self.duplicates = 0
        self.failures: Counter = Counter()  # (operator, reason) of proposals that came back empty
        #: called with the engine on its own thread after each batch of results is archived and
        #: committed (``evo run --rl-every`` hangs its RL updater here); a hook that raises is
        #: reported as an event and dropped, never the end of the run
        self.hooks: list[Callable[["Engine"], None]] = []
        self.proposing: dict[Future, tuple[str, Shape]] = {}  # asynchronous proposals running
        self.token_spenders: set[str] = set()  # operators that reported tokens
        self.switched_off: set[str] = set()  # operators the token budget stopped

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
                        if not self.inflight and not self.proposing:
                            reason = "exhausted"
                            self._announce(reason)
                    if not self.inflight and (reason is not None or not self.proposing):
                        break
                    if deadline is not None and self.clock() >= deadline:
                        self._abandon(reason or "drain_timeout")
                        break
                    done, _ = wait([*self.inflight, *self.proposing], timeout=self.TICK, return_when=FIRST_COMPLETED)
                    if done:
                        self._collect_proposals({f for f in done if f in self.proposing})
                        self._collect({f for f in done if f in self.inflight})
                    self.progress.update()
        finally:
            self._stop_proposals()
            self.archive.commit()
            result = RunResult(reason or "error", self.budget.used_evals, self.lost,
                               {str(s): self.populations[s].best.fitness if self.populations[s].best else None
                                for s in cfg.shapes},
                               self.budget.summary())
            self.events.emit("stop", None, reason=result.reason, evaluations=result.evaluations, lost=self.lost,
                             best=result.best, budget=result.budget, duplicates=self.duplicates,
                             proposal_failures={f"{op}: {why}": n for (op, why), n in self.failures.items()},
                             models={name: {m: dict(c) for m, c in model_face(op).outcomes.items()}
                                     for name, op in self.operators.items() if model_face(op).outcomes is not None},
                             bandit=self.chooser.summary() if isinstance(self.chooser, OperatorBandit) else None)
        return result

    def _why_stop(self) -> Optional[str]:
        if self.interrupts:
            return "interrupted"
        exhausted = self.budget.exhausted()
        if exhausted == "tokens":
            exhausted = self._tokens_spent()
        if exhausted:
            return exhausted
        if self.converged >= set(self.config.shapes):
            return "converged"
        limit = self.config.pool.max_consecutive_errors
        if limit and self.errors_in_a_row >= limit:
            return "pool_failing"
        return None

    def _tokens_spent(self) -> Optional[str]:
        """The token budget is reached: switch off the operators that spend tokens (once); the run
        goes on with the others, or stops (``tokens``) when none is left."""
        stop = self.token_spenders - self.switched_off
        if stop:
            self.switched_off |= stop
            self.events.emit("operators_stopped", None, budget="tokens", operators=sorted(stop),
                             used=self.budget.summary())
            self.progress.message(f"evo: token budget reached; no more proposals from {', '.join(sorted(stop))}")
        return None if set(self.operators) - self.switched_off else "tokens"

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
            self.progress.message(f"evo: {self.errors_in_a_row} runtime errors in a row: the evaluator pool looks "
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

    # -- start-up: rebuild from the archive, queue seeds ---------------------------------------
    def _prepare(self) -> None:
        archived = set(self.archive.shapes())
        for shape in self.config.shapes:
            evaluated: set[str] = set()
            if shape in archived:
                cands = {c.id: c for c in self.archive.candidates(shape)}
                for ev in self.archive.evaluations(shape):
                    evaluated.add(ev.candidate_id)
                    cand = cands.get(ev.candidate_id)
                    if cand is not None:
                        self._observe(shape, cand, ev)
                # candidates a killed run submitted but never saw evaluated: evaluate them now
                for cid, cand in cands.items():
                    if cid not in evaluated:
                        self.queue[shape].append((cand, "archived"))
            self.known[shape] = evaluated
            best = self.populations[shape].best
            self.progress.stats[shape].best = best.fitness if best else None
            if self.conv[shape].converged:
                self.converged.add(shape)
            if not evaluated and not self.queue[shape]:
                self._seed(shape, archived)

    def _seed(self, shape: Shape, archived: set[Shape]) -> None:
        cfg = self.config
        seeds: list[tuple[Candidate, str]] = []
        if cfg.transfer.enabled and cfg.transfer.neighbors > 0:
            def elites_of(s: Shape, n: int) -> list[tuple[Candidate, Evaluation]]:
                return [(e.candidate, e.latest) for e in self.archive.elites(s, n) if e.candidate is not None]

            for cand in transfer_candidates(shape, archived, elites_of, self.templates,
                                            neighbors=cfg.transfer.neighbors, per_neighbor=cfg.transfer.per_neighbor,
                                            specialize=cfg.specialize, arch=self.arch):
                seeds.append((cand, "transfer"))
        for cand in seed_population(shape, list(self.templates.values()), cfg.seeds_per_template, self.rng,
                                    arch=self.arch, specialize=cfg.specialize):
            seeds.append((cand, "seed"))
        seen: set[str] = set()
        for cand, op in seeds:
            if cand.id not in seen:
                seen.add(cand.id)
                self.queue[shape].append((cand, op))
        self.events.emit("seed", shape, transferred=sum(op == "transfer" for _, op in seeds),
                         templates=sum(op == "seed" for _, op in seeds))

    # -- proposing -----------------------------------------------------------------------------
    def _active(self) -> list[Shape]:
        return [s for s in self.config.shapes if s not in self.converged]

    def _load(self, shape: Shape) -> int:
        return self.populations[shape].evaluated + sum(1 for j in self.inflight.values() if j.shape == shape)

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
            got = self._next(shape)
            if got is None:
                misses[shape] += 1
                continue
            misses[shape] = 0
            self._submit(got[0], shape, got[1])

    def attainable(self, shape: Shape) -> Optional[float]:
        """The shape's best device time as a fraction of its floor-aware attainable time."""
        return attainable_frac(shape, self.best_time.get(shape), self.calibration)

    def stalled(self, shape: Shape) -> bool:
        """No improvement over the stall window, or (a shape whose every result failed so far)
        a quarter of it (at least 8) evaluations without one ok result."""
        window = self.config.allocation.stall_window
        if not window:
            return False
        if self.best_time[shape] is None:
            return self.populations[shape].evaluated >= max(8, window // 4)
        return self.stall[shape].converged

    def weights(self, shapes: list[Shape]) -> dict[Shape, float]:
        """Allocation weights of ``shapes`` (see evo/search/_budget.py)."""
        if not self.config.allocation.enabled:
            return {s: 1.0 for s in shapes}
        return shape_weights({s: self.attainable(s) for s in shapes}, {s: self.stalled(s) for s in shapes},
                             self.config.allocation.saturated)

    def _pick(self, shapes: list[Shape]) -> Shape:
        """The shape that gets the next proposal slot (weighted fair share by headroom)."""
        order = [s for s in self.config.shapes if s in shapes]
        loads = {s: self._load(s) for s in order}
        if not self.config.allocation.enabled:
            return min(order, key=lambda s: (loads[s], order.index(s)))
        weights = self.weights(order)
        for s in order:
            if weights[s] == 0 and s not in self.yielded:
                self.yielded.add(s)
                frac = self.attainable(s)
                why = "stalled" if self.stalled(s) else "saturated"
                self.events.emit("yield", s, why=why, attainable_frac=frac, evaluations=self.populations[s].evaluated)
                self.progress.message(f"evo: {s} yields its slots ({why}; "
                                      f"{'-' if frac is None else f'{frac:.2f}'} of its attainable time)")
        return pick_shape(order, loads, weights)

    #: The elite threshold sent with a job is this share of the current elite cutoff (a removed
    #: elite can lower the cutoff a little).
    ELITE_MARGIN = 0.95

    def _elite_threshold(self, shape: Shape) -> Optional[float]:
        """The speedup a new candidate must reach to join ``shape``'s elites now (None while the
        elite set is not full); the evaluator skips its memoisation timing pass below it."""
        population = self.populations[shape]
        elites = population.elites()
        if len(elites) < population.n_elites:
            return None
        return elites[-1].fitness * self.ELITE_MARGIN

    def _elite_thresholds(self, cand: Candidate, shape: Shape) -> EliteThreshold:
        """What a job carries: ``shape``'s threshold for a candidate that claims one shape; for
        one that claims several, each claimed shape's own (None for a shape this run does not
        evolve), since it can become an elite at any of them and the memo pass and host timers
        must not be skipped there on the proposing shape's cutoff."""
        if len(cand.shapes) <= 1:
            return self._elite_threshold(shape)
        return {str(s): self._elite_threshold(s) if s in self.populations else None for s in cand.shapes}

    def _submit(self, cand: Candidate, shape: Shape, op: str) -> None:
        self.archive.add(cand)
        fut = self.pool.submit(cand, elite_threshold=self._elite_thresholds(cand, shape))
        self.inflight[fut] = InFlight(cand, shape, op, self.clock())
        self.known[shape].add(cand.id)
        self.events.emit("proposal", shape, candidate=cand.id, operator=op, template=cand.template,
                         knobs=dict(cand.knobs) if cand.knobs is not None else None, parents=list(cand.parents))
