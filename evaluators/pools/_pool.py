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

import os
import queue
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from types import MappingProxyType, SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Status

from ._base import POOLS
from ._pool_core import CorePool, PoolCore, PoolItem, PoolStats
from .._job import EliteThreshold
from ..run import HARNESS_TARGET, WorkerSupervisor, WorkerUnavailable

__all__ = ["LocalPool", "PoolStats", "visible_gpus", "gpu_arch", "PRECISE_JOB"]


#: Job options (``LocalPool(job_options=...)``) for a measurement that must repeat across worker
#: starts, as ``evo eval`` makes by default: four times the device timer's replays of a run, and
#: three freshly allocated rotations. On the H200 at 4096^3 the sm90 seed's device medians over
#: five worker starts spread 0.75% this way against 1.5-2.7% with a run's settings
#: (bench/RESULTS.md, session 4): a longer window averages the clock's swings under the power
#: limit, which a short one samples at a random phase. At least 12 rounds (a run's floor is 3):
#: the budget's round count rests on an eager estimate of one call, which a cold clock inflated 4x
#: on the H200 at 256^3 (2026-12-03: 6 samples precise and quick alike).
PRECISE_JOB: Mapping[str, Any] = MappingProxyType({"budget_s": 0.2, "max_rounds": 400, "min_rounds": 12, "rotations": 3})


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


@POOLS.register("local")
class LocalPool(CorePool):
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
            raise WorkerUnavailable("no GPU is visible (nvidia-smi lists none): evaluating on this machine needs one")
        self.gpus = list(gpus)
        if arch is None and target == HARNESS_TARGET:
            arch = gpu_arch(self.gpus[0])
        self._core = PoolCore("LocalPool", timers=timers, qps=qps, job_options=job_options, cache_dir=cache_dir,
                              compile_timeout_s=compile_timeout_s, compile_fn=compile_fn,
                              slots=max_in_flight or (max(1, compile_workers) + 2 * len(self.gpus)),
                              stats=PoolStats(), arch=arch)
        self._compile_pool = ThreadPoolExecutor(max(1, compile_workers), thread_name_prefix="evo-compile")
        self._ready: "queue.Queue[Optional[PoolItem]]" = queue.Queue()
        self._alive = len(self.gpus)
        from .._provenance import code_version

        worker_options = {"evo_version": code_version(), **(worker_options or {})}
        self.supervisors = [WorkerSupervisor(g, target=target, options=worker_options, log_dir=log_dir,
                                             deadlines=deadlines) for g in self.gpus]
        self._threads = [threading.Thread(target=self._gpu_loop, args=(sup,), name=f"evo-gpu{sup.gpu}", daemon=True)
                         for sup in self.supervisors]
        for t in self._threads:
            t.start()

    # -- public -------------------------------------------------------------------------
    def submit(self, candidate: Candidate, *, elite_threshold: EliteThreshold = None) -> "Future[list[Evaluation]]":
        """Queue one candidate; blocks while the pool holds ``max_in_flight`` unfinished ones.

        ``elite_threshold``: the device speedup the candidate must reach to become an elite of
        its shape now; below it the worker skips the memoisation timing pass (a second device
        timing that only a would-be elite needs). None: always run it."""
        item = self._core.admit(candidate, elite_threshold)
        self._compile_pool.submit(self._core.compile, item, self._deliver)
        return item.future

    def cancel_all(self) -> None:
        """Drop every candidate that has not reached a GPU yet (a run abandoning its in-flight work).

        Their futures raise ``CancelledError``: compiles still running finish and are dropped,
        compiled jobs waiting for a GPU are dropped at once. A job already on a GPU ends within
        its phase deadlines and keeps its result. ``close()`` then returns without evaluating
        the queue. The pool takes no new work afterwards."""
        self._core.cancelled = True
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                break
            if item is None:  # a close() sentinel: put it back for the GPU thread it was meant for
                self._ready.put(None)
                break
            self._core.drop(item)

    def close(self) -> None:
        """Finish queued work (unless cancelled), then stop the worker processes."""
        if self._core.closed:
            return
        self._core.closed = True
        self._compile_pool.shutdown(wait=True)
        for _ in self._threads:
            self._ready.put(None)
        for t in self._threads:
            t.join(timeout=60)
        self._core.stop_results()
        for sup in self.supervisors:
            sup.close()

    def __enter__(self) -> "LocalPool":
        return self

    # -- pipeline -----------------------------------------------------------------------
    def _deliver(self, item: PoolItem) -> None:
        """A compiled item waits here for the first free GPU thread."""
        self._ready.put(item)

    def _gpu_loop(self, sup: WorkerSupervisor) -> None:
        core = self._core
        down: Optional[str] = None
        try:
            info = sup.start()
            core.set_arch(info.get("arch"))
        except Exception as exc:  # WorkerUnavailable, or anything else: never die silently
            down = self._lost(f"{exc}" if isinstance(exc, WorkerUnavailable) else f"worker start failed: {exc!r}")
        finally:
            core.arch_settled()  # compiles wait on it
        while True:
            item = self._ready.get()
            if item is None:
                return
            if core.cancelled:
                core.drop(item)
                continue
            if down is not None and self._alive > 0:  # leave the work to the GPUs that still run
                self._ready.put(item)
                return
            if down is not None:
                core.fail(item, Status.RUNTIME_ERROR, f"GPU worker unavailable: {down}")
                continue
            job = core.job(item).to_wire()  # the process boundary: a Job becomes the worker's dict here
            t0 = time.monotonic()
            core.job_started(t0)
            try:
                result = sup.run(job)
            except WorkerUnavailable as exc:
                down = self._lost(str(exc))
                result = {"status": Status.RUNTIME_ERROR, "message": f"GPU worker unavailable: {down}"}
            except Exception as exc:  # a supervisor bug must not strand the futures
                result = {"status": Status.RUNTIME_ERROR, "message": f"evaluator error: {exc!r}"}
            core.job_ended(sup.gpu, t0, time.monotonic())
            with core.lock:
                self.stats.restarts = sum(s.restarts for s in self.supervisors)
            # read now, before the next job: a later restart must not change what this result names
            view = SimpleNamespace(gpu=sup.gpu, pid=sup.pid, info=sup.info)
            core.hand_over(item, result, view)

    def _lost(self, why: str) -> str:
        """A GPU worker is gone for good; its thread stops taking work while another GPU runs."""
        with self._core.lock:
            self._alive -= 1
        return why
