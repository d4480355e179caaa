"""Test double for the evaluator pool (a boundary the CPU machines cannot cross: they have no GPU).

``FakeEvaluatorPool`` stands in for ``evaluators.LocalPool`` in engine and ``evo run`` tests:
``submit(candidate) -> Future[list[Evaluation]]`` on a thread pool, one Evaluation per claimed
shape. Nothing is compiled or timed. The fitness is a deterministic synthetic function of the
knobs and the shape (:func:`synthetic_fitness`: a smooth bowl around a per-shape optimum, so
selection pressure and convergence are observable), and a fixed share of candidates, chosen by
their id, fail as compile errors, incorrect results, worker crashes or a failed future.

The command line never names it: tests hand it to the library core, ``evo.cli.main(argv,
pool_factory=FakeEvaluatorPool)`` (``tests/test_cli.py``'s ``evo()``); its behaviour there can be
tuned with ``EVO_FAKE_*`` variables.
"""
from __future__ import annotations

import hashlib
import math
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Optional

from evaluators import EvaluatorPool
from populations import Candidate, Evaluation, KernelStats, Shape, Status, TimerResult

__all__ = ["FakeEvaluatorPool", "synthetic_fitness"]


def _unit(*parts: Any) -> float:
    """A deterministic number in [0, 1) from its arguments."""
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def synthetic_fitness(candidate: Candidate, shape: Shape) -> float:
    """Speedup in (0.2, 1.6]: 1.6 at a per-(shape, knob) optimum, falling off smoothly with distance.

    Integer knobs are compared in log2 (the optimum is one of 1..256); other knobs score by a
    fixed per-value preference. Candidates without knobs get a fixed value from their id."""
    if not candidate.knobs:
        return 0.2 + 0.8 * _unit(candidate.id)
    dist = 0.0
    for name, value in sorted(candidate.knobs.items()):
        if isinstance(value, int) and not isinstance(value, bool):
            target = 2 ** int(_unit("opt", shape.key, name) * 9)
            dist += (math.log2(max(value, 1)) - math.log2(target)) ** 2 / 4.0
        else:
            dist += _unit("pref", shape.key, name, value)
    return 0.2 + 1.4 * math.exp(-0.15 * dist)


class FakeEvaluatorPool(EvaluatorPool):
    """See the module docstring. Shares are fractions of candidates (by id): ``fail`` compile
    errors, ``incorrect``, ``crash`` runtime errors, ``raise_`` futures that raise. It takes
    ``elite_threshold`` and ignores it; it has no GPUs and no arch (the base's defaults)."""

    def __init__(self, config: Any = None, *, delay_s: Optional[float] = None, gpu_s: Optional[float] = None,
                 fail: Optional[float] = None, incorrect: Optional[float] = None, crash: Optional[float] = None,
                 raise_: Optional[float] = None, workers: int = 4) -> None:
        env = os.environ
        self.delay_s = delay_s if delay_s is not None else float(env.get("EVO_FAKE_DELAY_S", "0"))
        self.gpu_s = gpu_s if gpu_s is not None else float(env.get("EVO_FAKE_GPU_S", "0.01"))
        self.fail = fail if fail is not None else float(env.get("EVO_FAKE_FAIL", "0.05"))
        self.incorrect = incorrect if incorrect is not None else float(env.get("EVO_FAKE_INCORRECT", "0.03"))
        self.crash = crash if crash is not None else float(env.get("EVO_FAKE_CRASH", "0.02"))
        self.raise_ = raise_ if raise_ is not None else float(env.get("EVO_FAKE_RAISE", "0.01"))
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="fake-pool")
        self._cancel = threading.Event()
        self._closed = False
        self.submitted: list[str] = []
        self.completed = 0
        self.max_inflight = 0
        self._inflight = 0
        self._lock = threading.Lock()

    def submit(self, candidate: Candidate, *, elite_threshold: Optional[float] = None) -> "Future[list[Evaluation]]":
        if self._closed or self._cancel.is_set():
            raise RuntimeError("FakeEvaluatorPool is closed" if self._closed else "FakeEvaluatorPool was cancelled")
        with self._lock:
            self.submitted.append(candidate.id)
            self._inflight += 1
            self.max_inflight = max(self.max_inflight, self._inflight)
        return self._executor.submit(self._evaluate, candidate)

    def cancel_all(self) -> None:
        self._cancel.set()

    def close(self) -> None:
        self._closed = True
        self._cancel.set()
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _evaluate(self, candidate: Candidate) -> list[Evaluation]:
        try:
            if self.delay_s:
                self._cancel.wait(self.delay_s)
            u = _unit("fate", candidate.id)
            if u < self.raise_:
                raise RuntimeError("fake pool: worker connection lost")
            out = []
            for shape in candidate.shapes:
                out.append(self._one(candidate, shape, u - self.raise_))
            return out
        finally:
            with self._lock:
                self._inflight -= 1
                self.completed += 1

    def _one(self, candidate: Candidate, shape: Shape, u: float) -> Evaluation:
        knobs = candidate.knobs or {}
        regs = 32 + 8 * int(_unit("regs", sorted(knobs.items())) * 24)
        kernels = (KernelStats("evo_gemm", registers=regs),)
        common = dict(candidate_id=candidate.id, shape=shape, compile_s=0.001, arch="sm_90a",
                      provenance={"pool": "fake"})
        if u < self.fail:
            return Evaluation(status=Status.COMPILE_ERROR, message="fake: error: identifier undefined", **common)
        u -= self.fail
        if u < self.incorrect:
            return Evaluation(status=Status.INCORRECT, message="fake: max error 3.2 > tol", kernels=kernels,
                              correctness_s=self.gpu_s, **common)
        u -= self.incorrect
        if u < self.crash:
            return Evaluation(status=Status.RUNTIME_ERROR, message="fake: worker crashed (SIGSEGV); restarted",
                              kernels=kernels, correctness_s=self.gpu_s / 2, **common)
        fit = synthetic_fitness(candidate, shape)
        timer = TimerResult(median=1e-3 / fit, lo=0.99e-3 / fit, hi=1.01e-3 / fit, baseline_median=1e-3,
                            baseline_lo=0.99e-3, baseline_hi=1.01e-3, samples=10)
        return Evaluation(status=Status.OK, timers={"device": timer}, kernels=kernels, max_error=1e-3,
                          correctness_s=self.gpu_s / 2, timing_s=self.gpu_s / 2, **common)
