"""What LocalPool and RayPool share, as one object each of them holds (composition, not copies).

:class:`PoolCore` owns the parts where the two pools agree: the settings every job and compile
is built from, back-pressure (``max_in_flight`` slots), the arch wait, the compile step, the
worker job a compiled candidate becomes, and turning a worker's result into Evaluations (one
per claimed shape) before its future is resolved. The pools keep what differs: where compiled
candidates wait and which GPU takes them (LocalPool: one queue and a thread per GPU; RayPool:
per-actor queues with shape affinity and retries).
"""
from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from concurrent.futures import CancelledError, Future
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Shape, Status, TimerResult

from .._job import JOB_OPTIONS, EliteThreshold, Job, Result
from ._base import EvaluatorPool

__all__ = ["CorePool", "PoolCore", "PoolItem", "PoolStats"]

log = logging.getLogger("evo.evaluators.pool")


def _threshold_hint(thr: EliteThreshold) -> Any:
    """The wire form of an elite threshold: a float, or a dict of shape string -> float or None."""
    if isinstance(thr, Mapping):
        return {str(k): None if v is None else float(v) for k, v in thr.items()}
    return float(thr)

@dataclass
class PoolStats:
    """Where the time went: per-GPU busy seconds inside jobs, compile seconds, counts."""

    started: float = field(default_factory=time.monotonic)
    gpu_busy_s: dict[int, float] = field(default_factory=dict)
    first_job: Optional[float] = None
    last_job_end: Optional[float] = None
    compile_s: float = 0.0
    compiled: int = 0
    evaluated: int = 0
    restarts: int = 0

    def busy_fraction(self) -> float:
        """Share of the GPU phase (first job start to last job end) the workers were busy."""
        if self.first_job is None or self.last_job_end is None or not self.gpu_busy_s:
            return 0.0
        span = self.last_job_end - self.first_job
        return sum(self.gpu_busy_s.values()) / (span * len(self.gpu_busy_s)) if span > 0 else 0.0


@dataclass
class PoolItem:
    """One submitted candidate on its way through a pool."""

    candidate: Candidate
    future: Future
    compiled: Any = None           # the CompileResult, once compiled
    attempts: int = 0              # GPU attempts so far (RayPool retries a candidate whose actor died)
    hints: dict = field(default_factory=dict)   # per-job options from submit (elite_threshold)


class PoolCore:
    """The shared half of a pool (see the module docstring). ``name`` goes into error messages.

    ``compile_fn(candidate, arch, timeout_s=, cache_dir=)`` compiles one candidate (None: the
    real compiler, imported only now: the other half of issue 4). ``arch`` None: unknown until
    :meth:`set_arch` (a worker's ready message) or :meth:`arch_settled`."""

    def __init__(self, name: str, *, timers: Sequence[str], qps: float, job_options: Optional[Mapping[str, Any]],
                 cache_dir: Any, compile_timeout_s: float, compile_fn: Optional[Callable[..., Any]],
                 slots: int, stats: PoolStats, arch: Optional[str]) -> None:
        self.name = name
        self.timers = tuple(timers)
        self.qps = qps
        self.job_options = dict(job_options or {})
        unknown = sorted(set(self.job_options) - set(JOB_OPTIONS))
        if unknown:  # refused here, not in the worker after the first compile
            raise TypeError(f"unknown job option(s) {unknown}; known: {sorted(JOB_OPTIONS)}")
        self.cache_dir = cache_dir
        self.compile_timeout_s = compile_timeout_s
        if compile_fn is None:
            from ..compile import compile_candidate as compile_fn  # noqa: N813
        self.compile_fn: Callable[..., Any] = compile_fn
        self.stats = stats
        self.lock = threading.Lock()   # guards stats (and, in RayPool, its queues)
        self.slots = threading.BoundedSemaphore(max(1, slots))
        self.closed = False
        self.cancelled = False
        self._arch = arch
        self._arch_known = threading.Event()
        if arch is not None:
            self._arch_known.set()
        # worker results are turned into Evaluations and handed to their futures on this thread,
        # so that a GPU's dispatcher sends its worker the next job at once (the worker would idle
        # while the dispatcher read the result)
        self._results: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._finisher = threading.Thread(target=self._finish_loop, name=f"{name}-results", daemon=True)
        self._finisher.start()

    # -- arch ------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        """The target arch; waits until a worker has said it (or none will)."""
        self._arch_known.wait()
        return self._arch or "sm_90a"

    @property
    def arch_or_none(self) -> Optional[str]:
        """The arch if known now, without waiting."""
        return self._arch

    def set_arch(self, arch: Optional[str]) -> None:
        """A worker reported its arch: keep the first one given."""
        if self._arch is None and arch:
            self._arch = arch

    def arch_settled(self) -> None:
        """No better arch is coming (a worker started or failed): let waiting compiles go on."""
        self._arch_known.set()

    # -- futures ---------------------------------------------------------------------------
    def admit(self, candidate: Candidate, elite_threshold: EliteThreshold) -> PoolItem:
        """A new item for ``candidate``; blocks while every slot is taken; RuntimeError once
        the pool is closed or cancelled."""
        if self.closed or self.cancelled:
            raise RuntimeError(f"{self.name} is closed" if self.closed else f"{self.name} was cancelled")
        self.slots.acquire()
        hints = {} if elite_threshold is None else {"elite_threshold": _threshold_hint(elite_threshold)}
        item = PoolItem(candidate, Future(), hints=hints)
        item.future.set_running_or_notify_cancel()
        return item

    def finish(self, item: PoolItem, evals: list[Evaluation]) -> None:
        """Resolve ``item``'s future with its Evaluations and free its slot."""
        with self.lock:
            self.stats.evaluated += 1
        try:
            item.future.set_result(evals)
        finally:  # a future resolved elsewhere must not keep its slot
            self.slots.release()

    def hand_over(self, item: PoolItem, result: Mapping[str, Any], view: Any) -> None:
        """Queue a worker's ``result`` for ``item`` (``view``: the worker as it was when the
        result came, see :meth:`evaluations`) for the results thread, and return at once."""
        self._results.put((item, result, view))

    def stop_results(self, timeout: float = 60.0) -> None:
        """Resolve every result handed over so far, then end the results thread."""
        self._results.put(None)
        self._finisher.join(timeout=timeout)

    def _finish_loop(self) -> None:
        """Turn worker results into Evaluations and resolve their futures, in arrival order."""
        while True:
            got = self._results.get()
            if got is None:
                return
            item, result, view = got
            try:
                self.finish(item, self.evaluations(item, result, view))
            except Exception:  # this thread resolves every later future too: log, never die
                log.exception("evaluator: resolving candidate %s failed", item.candidate.id)
                if not item.future.done():
                    self.finish(item, [self.record(item.candidate, s, Status.RUNTIME_ERROR,
                                                   "evaluator error while reading the worker's result")
                                       for s in item.candidate.shapes])

    def fail(self, item: PoolItem, status: Status, message: str) -> None:
        """Resolve ``item`` with the same failure at every claimed shape."""
        cand = item.candidate
        self.finish(item, [self.record(cand, s, status, message, compile=item.compiled) for s in cand.shapes])

    def drop(self, item: PoolItem) -> None:
        """Resolve a cancelled candidate's future without evaluating it."""
        item.future.set_exception(CancelledError(f"{self.name}.cancel_all() dropped this candidate"))
        self.slots.release()

    def job_started(self, t0: float) -> None:
        """A job went to a GPU at ``t0`` (the busy fraction's span starts at the first)."""
        with self.lock:
            self.stats.first_job = self.stats.first_job or t0

    def job_ended(self, gpu: int, t0: float, t1: float) -> None:
        """``gpu`` was busy from ``t0`` to ``t1`` on one job."""
        with self.lock:
            self.stats.gpu_busy_s[gpu] = self.stats.gpu_busy_s.get(gpu, 0.0) + (t1 - t0)
            self.stats.last_job_end = t1

    # -- compile step ----------------------------------------------------------------------
    def compile(self, item: PoolItem, deliver: Callable[[PoolItem], None]) -> None:
        """Compile ``item`` (on the calling thread); a failure resolves it, a success goes to
        ``deliver`` (the pool's GPU queue), unless the pool was cancelled meanwhile."""
        cand = item.candidate
        try:
            res = self.compile_fn(cand, self.arch, timeout_s=self.compile_timeout_s, cache_dir=self.cache_dir)
            with self.lock:
                self.stats.compile_s += res.seconds
                self.stats.compiled += 1
            if not res.ok:
                self.finish(item, [self.record(cand, s, res.status, res.message, compile=res) for s in cand.shapes])
                return
        except Exception as exc:  # a compiler-side bug must not lose (or strand) the candidate
            self.fail(item, Status.COMPILE_ERROR, f"compile crashed: {exc!r}")
            return
        item.compiled = res
        if self.cancelled:
            self.drop(item)
            return
        deliver(item)

    def job(self, item: PoolItem) -> Job:
        """The worker job for a compiled item: the pool's options, then the submit's hints."""
        cand = item.candidate
        plan = cand.plan
        if getattr(item.compiled, "waits_on_ctas", None) and not plan.coresident:
            # the machine code may wait on other CTAs (evaluators.compile._sass): check residency as if declared
            plan = dataclasses.replace(plan, coresident=True)
        job = Job(cubin=item.compiled.cubin, plan=plan, shapes=tuple(cand.shapes), generic=cand.generic,
                  timers=self.timers, qps=self.qps, candidate_id=cand.id, meta=dict(cand.meta))
        return job.with_options({**self.job_options, **item.hints})

    # -- records ---------------------------------------------------------------------------
    def record(self, cand: Candidate, shape: Shape, status: Any, message: str, *, compile: Any = None,
               **kw: Any) -> Evaluation:
        """One Evaluation of ``cand`` at ``shape`` (compile facts filled in when compiled)."""
        return Evaluation(candidate_id=cand.id, shape=shape, status=Status(status), message=message,
                          kernels=tuple(compile.kernels) if compile is not None else (),
                          compile_s=compile.seconds if compile is not None else 0.0,
                          arch=getattr(compile, "arch", "") or (self._arch or ""), **kw)

    def evaluations(self, item: PoolItem, result: Mapping[str, Any], worker: Any) -> list[Evaluation]:
        """One Evaluation per claimed shape from a worker's result (its wire dict); ``worker`` is
        the one that ran the job (``gpu``, ``pid``, ``info``); read errors become runtime errors."""
        try:
            return self._evaluations(item.candidate, item.compiled, Result.from_wire(result), worker)
        except Exception as exc:
            cand = item.candidate
            return [self.record(cand, s, Status.RUNTIME_ERROR, f"evaluator error reading the result: {exc!r}",
                                compile=item.compiled) for s in cand.shapes]

    def _evaluations(self, cand: Candidate, comp: Any, result: Result, sup: Any) -> list[Evaluation]:
        base_prov = dict(sup.info.get("provenance", {}))
        base_prov.update(gpu_index=sup.gpu, worker_pid=sup.pid, seed=result.seed, load_s=result.load_s)
        out = []
        for shape in cand.shapes:
            r = result.shape(shape)
            if r is None:
                status, msg = result.status, result.message
                if status is Status.OK:  # the job ended early at an earlier shape
                    status, msg = Status.RUNTIME_ERROR, "not evaluated: the worker was lost at an earlier shape"
                out.append(self.record(cand, shape, status, msg, compile=comp, provenance=base_prov))
                continue
            timers = {name: TimerResult(**t) for name, t in r.timers.items()}
            # provenance: the worker's GPU, driver and clocks; how it measured goes on the measurement
            out.append(self.record(cand, shape, r.status, r.message, compile=comp, timers=timers, flags=r.flags,
                                   max_error=r.max_error, correctness_s=r.correctness_s, timing_s=r.timing_s,
                                   provenance={**base_prov, **r.provenance}, measurement=r.measurement))
        return out


class CorePool(EvaluatorPool):
    """An EvaluatorPool built on a :class:`PoolCore` (``self._core``): the properties that only
    forward to the core, written once for LocalPool and RayPool."""

    _core: PoolCore

    @property
    def stats(self) -> PoolStats:
        """Where the time went (busy seconds per GPU, compiles, restarts; RayPool adds its Ray
        counts); assign a fresh stats record to start counting again (a benchmark's measured phase)."""
        return self._core.stats

    @stats.setter
    def stats(self, value: PoolStats) -> None:
        self._core.stats = value

    @property
    def arch(self) -> str:
        """The target arch: given, else nvidia-smi's (LocalPool), else the first worker's (waits for it)."""
        return self._core.arch
