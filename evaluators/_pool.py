"""LocalPool: compile on CPU threads while one supervised worker per GPU checks and times.

``submit(candidate) -> Future[list[Evaluation]]`` (one Evaluation per claimed shape) and
``evaluate(candidates) -> list[Evaluation]``. The pipeline keeps the GPUs fed: compiles
(``compile_candidate``, each in its own isolated child process, so threads give real
parallelism) run ahead while the GPU workers evaluate earlier candidates; finished compiles
wait in a queue the GPU dispatchers drain. ``submit`` blocks while ``max_in_flight`` candidates
are unfinished (back-pressure), which bounds memory and the compile lead.

The parent never initialises CUDA: the GPU count comes from ``nvidia-smi -L``, the arch from
``nvidia-smi --query-gpu=compute_cap`` (or the first worker's ready message).
"""
from __future__ import annotations

import logging
import os
import queue
import subprocess
import threading
import time
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import MappingProxyType, SimpleNamespace
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Shape, Status, TimerResult

from ._worker import HARNESS_TARGET, WorkerSupervisor, WorkerUnavailable

__all__ = ["LocalPool", "PoolStats", "visible_gpus", "gpu_arch", "PRECISE_JOB"]

log = logging.getLogger("evo.evaluators.pool")

#: Job options (``LocalPool(job_options=...)``) for a measurement that must repeat across worker
#: starts, as ``evo eval`` makes by default: four times the device timer's replays of a run, and
#: three freshly allocated rotations. On the H200 at 4096^3 the sm90 seed's device medians over
#: five worker starts spread 0.75% this way against 1.5-2.7% with a run's settings
#: (bench/RESULTS.md, session 4): a longer window averages the clock's swings under the power
#: limit, which a short one samples at a random phase.
PRECISE_JOB: Mapping[str, Any] = MappingProxyType({"budget_s": 0.2, "max_rounds": 400, "rotations": 3})


def visible_gpus() -> list[int]:
    """Indices of the GPUs this process may use (without initialising CUDA here)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return list(range(len([v for v in env.split(",") if v.strip()])))
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return list(range(sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))))


def gpu_arch(gpu: int = 0) -> Optional[str]:
    """``sm_90a`` for compute capability 9.0, ``sm_XY`` otherwise; None where nvidia-smi cannot say."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        cap = out.stdout.split()[gpu].strip()
        major, minor = (int(x) for x in cap.split("."))
    except (OSError, subprocess.TimeoutExpired, IndexError, ValueError):
        return None
    return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


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
class _Item:
    candidate: Candidate
    future: Future
    compiled: Any = None
    hints: dict = field(default_factory=dict)


class LocalPool:
    """Evaluate candidates on this machine's GPUs (see the module docstring)."""

    def __init__(self, gpus: Optional[Sequence[int] | int] = None, compile_workers: int = 4, *,
                 arch: Optional[str] = None, target: str = HARNESS_TARGET,
                 worker_options: Optional[Mapping[str, Any]] = None, deadlines: Optional[Mapping[str, float]] = None,
                 log_dir: Optional[str] = None, timers: Sequence[str] = ("device", "offline", "server"),
                 qps: float = 2000.0, max_in_flight: Optional[int] = None, cache_dir: Any = None,
                 compile_timeout_s: float = 60.0, compile_fn: Optional[Callable[..., Any]] = None,
                 job_options: Optional[Mapping[str, Any]] = None) -> None:
        if gpus is None:
            gpus = visible_gpus()
        elif isinstance(gpus, int):
            gpus = list(range(gpus))
        if not gpus:
            raise WorkerUnavailable("no GPU is visible (nvidia-smi lists none); LocalPool needs at least one")
        self.gpus = list(gpus)
        self._compile_fn = self._job_settings(timers, qps, job_options, cache_dir, compile_timeout_s, compile_fn)
        self.stats = PoolStats()
        self._lock = threading.Lock()
        self._compile_pool = ThreadPoolExecutor(max(1, compile_workers), thread_name_prefix="evo-compile")
        self._ready: "queue.Queue[Optional[_Item]]" = queue.Queue()
        self._slots = threading.BoundedSemaphore(max_in_flight or (max(1, compile_workers) + 2 * len(self.gpus)))
        self._closed = False
        self._cancelled = False
        self._alive = len(self.gpus)
        from ._provenance import code_version

        worker_options = {"evo_version": code_version(), **(worker_options or {})}
        self.supervisors = [WorkerSupervisor(g, target=target, options=worker_options, log_dir=log_dir,
                                             deadlines=deadlines) for g in self.gpus]
        self._arch = arch
        self._arch_known = threading.Event()
        if arch is None:
            self._arch = gpu_arch(self.gpus[0]) if target == HARNESS_TARGET else None
        if self._arch is not None:
            self._arch_known.set()
        self._threads = [threading.Thread(target=self._gpu_loop, args=(sup,), name=f"evo-gpu{sup.gpu}", daemon=True)
                         for sup in self.supervisors]
        # results are turned into Evaluations and handed to their futures here, so that a GPU
        # thread sends its worker the next job at once (the worker idles while the parent reads)
        self._results: "queue.Queue[Optional[tuple]]" = queue.Queue()
        self._finisher = threading.Thread(target=self._finish_loop, name="evo-results", daemon=True)
        self._finisher.start()
        for t in self._threads:
            t.start()

    # -- public -------------------------------------------------------------------------
    def _job_settings(self, timers: Sequence[str], qps: float, job_options: Optional[Mapping[str, Any]],
                      cache_dir: Any, compile_timeout_s: float,
                      compile_fn: Optional[Callable[..., Any]]) -> Callable[..., Any]:
        """Keep what every job and compile is built from (shared with RayPool); returns the
        compile function: ``compile_fn``, else the real compiler (the other half of issue 4)."""
        self.timers = tuple(timers)
        self.qps = qps
        self.job_options = dict(job_options or {})
        self.cache_dir = cache_dir
        self.compile_timeout_s = compile_timeout_s
        if compile_fn is None:
            from ._compile import compile_candidate as compile_fn  # noqa: N813
        return compile_fn

    @property
    def arch(self) -> str:
        self._arch_known.wait()
        return self._arch or "sm_90a"

    #: ``submit`` takes ``elite_threshold`` (the engine looks for this before passing it).
    takes_elite_threshold = True

    def submit(self, candidate: Candidate, *, elite_threshold: Optional[float] = None) -> "Future[list[Evaluation]]":
        """Queue one candidate; blocks while the pool holds ``max_in_flight`` unfinished ones.

        ``elite_threshold``: the device speedup the candidate must reach to become an elite of
        its shape now; below it the worker skips the memoisation timing pass (a second device
        timing that only a would-be elite needs). None: always run it."""
        if self._closed or self._cancelled:
            raise RuntimeError("LocalPool is closed" if self._closed else "LocalPool was cancelled")
        self._slots.acquire()
        hints = {} if elite_threshold is None else {"elite_threshold": float(elite_threshold)}
        item = _Item(candidate, Future(), hints=hints)
        item.future.set_running_or_notify_cancel()
        self._compile_pool.submit(self._compile, item)
        return item.future

    def evaluate(self, candidates: Iterable[Candidate]) -> list[Evaluation]:
        """Evaluate all, pipelined; Evaluations in candidate order, then shape order."""
        futures = [self.submit(c) for c in candidates]
        return [e for f in futures for e in f.result()]

    def cancel_all(self) -> None:
        """Drop every candidate that has not reached a GPU yet (a run abandoning its in-flight work).

        Their futures raise ``CancelledError``: compiles still running finish and are dropped,
        compiled jobs waiting for a GPU are dropped at once. A job already on a GPU ends within
        its phase deadlines and keeps its result. ``close()`` then returns without evaluating
        the queue. The pool takes no new work afterwards."""
        self._cancelled = True
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            if item is None:  # a close() sentinel: put it back for the GPU thread it was meant for
                self._ready.put(None)
                break
            self._drop(item)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._compile_pool.shutdown(wait=True)
        for _ in self._threads:
            self._ready.put(None)
        for t in self._threads:
            t.join(timeout=60)
        self._results.put(None)
        self._finisher.join(timeout=60)
        for sup in self.supervisors:
            sup.close()

    def __enter__(self) -> "LocalPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- pipeline -----------------------------------------------------------------------
    def _compile(self, item: _Item) -> None:
        cand = item.candidate
        try:
            res = self._compile_fn(cand, self.arch, timeout_s=self.compile_timeout_s, cache_dir=self.cache_dir)
            with self._lock:
                self.stats.compile_s += res.seconds
                self.stats.compiled += 1
            if not res.ok:
                self._finish(item, [self._record(cand, s, res.status, res.message, compile=res) for s in cand.shapes])
                return
        except Exception as exc:  # a compiler-side bug must not lose (or strand) the candidate
            self._finish(item, [self._record(cand, s, Status.COMPILE_ERROR, f"compile crashed: {exc!r}")
                                for s in cand.shapes])
            return
        item.compiled = res
        if self._cancelled:
            self._drop(item)
            return
        self._ready.put(item)

    def _gpu_loop(self, sup: WorkerSupervisor) -> None:
        down: Optional[str] = None
        try:
            info = sup.start()
            if self._arch is None:
                self._arch = info.get("arch")
        except Exception as exc:  # WorkerUnavailable, or anything else: never die silently
            down = self._lost(f"{exc}" if isinstance(exc, WorkerUnavailable) else f"worker start failed: {exc!r}")
        finally:
            self._arch_known.set()  # compiles wait on it
        while True:
            item = self._ready.get()
            if item is None:
                return
            if self._cancelled:
                self._drop(item)
                continue
            cand, comp = item.candidate, item.compiled
            if down is not None and self._alive > 0:  # leave the work to the GPUs that still run
                self._ready.put(item)
                return
            if down is not None:
                self._finish(item, [self._record(cand, s, Status.RUNTIME_ERROR, f"GPU worker unavailable: {down}",
                                                 compile=comp) for s in cand.shapes])
                continue
            job = {"cubin": comp.cubin, "plan": cand.plan.to_dict(), "shapes": [str(s) for s in cand.shapes],
                   "generic": cand.generic, "timers": list(self.timers), "qps": self.qps,
                   "candidate_id": cand.id, "meta": dict(cand.meta), **self.job_options, **item.hints}
            t0 = time.monotonic()
            with self._lock:
                self.stats.first_job = self.stats.first_job or t0
            try:
                result = sup.run(job)
            except WorkerUnavailable as exc:
                down = self._lost(str(exc))
                result = {"status": "runtime_error", "message": f"GPU worker unavailable: {down}"}
            except Exception as exc:  # a supervisor bug must not strand the futures
                result = {"status": "runtime_error", "message": f"evaluator error: {exc!r}"}
            t1 = time.monotonic()
            with self._lock:
                self.stats.gpu_busy_s[sup.gpu] = self.stats.gpu_busy_s.get(sup.gpu, 0.0) + (t1 - t0)
                self.stats.last_job_end = t1
                self.stats.restarts = sum(s.restarts for s in self.supervisors)
            # read now, before the next job: a later restart must not change what this result names
            view = SimpleNamespace(gpu=sup.gpu, pid=sup.pid, info=sup.info)
            self._results.put((item, result, view))

    def _finish_loop(self) -> None:
        """Turn worker results into Evaluations and resolve their futures, in arrival order."""
        while True:
            got = self._results.get()
            if got is None:
                return
            item, result, view = got
            cand, comp = item.candidate, item.compiled
            try:
                evals = self._evaluations(cand, comp, result, view)
            except Exception as exc:
                evals = [self._record(cand, s, Status.RUNTIME_ERROR, f"evaluator error reading the result: {exc!r}",
                                      compile=comp) for s in cand.shapes]
            try:
                self._finish(item, evals)
            except Exception:  # this thread resolves every later future too: log, never die
                log.exception("evaluator: resolving candidate %s failed", cand.id)

    def _lost(self, why: str) -> str:
        """A GPU worker is gone for good; its thread stops taking work while another GPU runs."""
        with self._lock:
            self._alive -= 1
        return why

    def _drop(self, item: _Item) -> None:
        """Resolve a cancelled candidate's future without evaluating it."""
        item.future.set_exception(CancelledError("LocalPool.cancel_all() dropped this candidate"))
        self._slots.release()

    def _finish(self, item: _Item, evals: list[Evaluation]) -> None:
        with self._lock:
            self.stats.evaluated += 1
        item.future.set_result(evals)
        self._slots.release()

    # -- records ------------------------------------------------------------------------
    def _record(self, cand: Candidate, shape: Shape, status: Any, message: str, *, compile: Any = None,
                **kw: Any) -> Evaluation:
        return Evaluation(candidate_id=cand.id, shape=shape, status=Status(status), message=message,
                          kernels=tuple(compile.kernels) if compile is not None else (),
                          compile_s=compile.seconds if compile is not None else 0.0,
                          arch=getattr(compile, "arch", "") or (self._arch or ""), **kw)

    def _evaluations(self, cand: Candidate, comp: Any, result: Mapping[str, Any], sup: Any) -> list[Evaluation]:
        """One Evaluation per claimed shape; ``sup`` is the worker that ran the job (``gpu``,
        ``pid``, ``info``)."""
        base_prov = dict(sup.info.get("provenance", {}))
        base_prov.update(gpu_index=sup.gpu, worker_pid=sup.pid, seed=result.get("seed"), load_s=result.get("load_s"))
        done = {r["shape"]: r for r in result.get("shapes") or ()}
        out = []
        for shape in cand.shapes:
            r = done.get(str(shape))
            if r is None:
                status = result.get("status", "runtime_error")
                if status == "ok":  # the job ended early at an earlier shape
                    status, msg = "runtime_error", "not evaluated: the worker was lost at an earlier shape"
                else:
                    msg = result.get("message", "")
                out.append(self._record(cand, shape, status, msg, compile=comp, provenance=base_prov))
                continue
            timers = {name: TimerResult(**t) for name, t in (r.get("timers") or {}).items()}
            prov = {**base_prov, **(r.get("provenance") or {}), "checks": list(r.get("checks") or ()),
                    "rotation_sets": r.get("rotation_sets"), "rotation_bytes": r.get("rotation_bytes"),
                    "floor_s": r.get("floor_s"), "phases": r.get("phases"), "memo_check": r.get("memo_check")}
            if r.get("device_rotations"):
                prov["device_rotations"] = r["device_rotations"]
            out.append(self._record(cand, shape, r["status"], r.get("message", ""), compile=comp, timers=timers,
                                    flags=tuple(r.get("flags") or ()), max_error=r.get("max_error"),
                                    correctness_s=float(r.get("correctness_s") or 0.0),
                                    timing_s=float(r.get("timing_s") or 0.0), provenance=prov))
        return out

