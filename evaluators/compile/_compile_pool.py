"""``CompilePool``: compile candidates on CPU processes and hand back futures.

A ``ProcessPoolExecutor`` over the ``spawn`` context (workers are fresh interpreters, safe to
create from a process that has initialised CUDA). Each worker runs
:func:`~evaluators.compile_candidate`, which puts every compile in its own killable child, so a
hanging or crashing compiler costs one result (``COMPILE_ERROR``), never the pool. Should a
worker die anyway, the pool is rebuilt and the affected futures carry a ``COMPILE_ERROR``.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import threading
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from populations import Candidate, Status

from ._compile import CompileResult, compile_candidate

__all__ = ["CompilePool"]


class CompilePool:
    """``submit(candidate, arch, **kw) -> Future[CompileResult]``; ``map`` for a batch.

    Keyword arguments given here (``timeout_s``, ``cache_dir``, ``backend``, ``mem_mb``...) are
    defaults for every ``submit``.
    """

    def __init__(self, workers: int | None = None, **defaults: Any) -> None:
        self.workers = max(1, workers or os.cpu_count() or 1)
        self.defaults = defaults
        self._lock = threading.Lock()
        self._executor = self._new_executor()

    def _new_executor(self) -> ProcessPoolExecutor:
        return ProcessPoolExecutor(max_workers=self.workers, mp_context=mp.get_context("spawn"))

    def submit(self, candidate: Candidate, arch: str, **kw: Any) -> "Future[CompileResult]":
        options = {**self.defaults, **kw}
        out: Future[CompileResult] = Future()
        with self._lock:
            try:
                inner = self._executor.submit(compile_candidate, candidate, arch, **options)
            except BrokenProcessPool:
                self._executor = self._new_executor()
                inner = self._executor.submit(compile_candidate, candidate, arch, **options)

        def done(f: "Future[CompileResult]") -> None:
            try:
                out.set_result(f.result())
            except BrokenProcessPool as exc:
                with self._lock:
                    self._executor = self._new_executor()
                out.set_result(CompileResult(False, Status.COMPILE_ERROR, f"compile worker died: {exc}",
                                             backend=str(options.get("backend") or ""), arch=arch))
            except BaseException as exc:  # a bug in our code: surface it on the future
                out.set_exception(exc)

        inner.add_done_callback(done)
        return out

    def map(self, candidates: list[Candidate], arch: str, **kw: Any) -> list[CompileResult]:
        """Compile all, blocking; results in input order."""
        return [f.result() for f in [self.submit(c, arch, **kw) for c in candidates]]

    def shutdown(self, wait: bool = True) -> None:
        self._executor.shutdown(wait=wait, cancel_futures=not wait)

    def __enter__(self) -> "CompilePool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
