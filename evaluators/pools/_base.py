"""The evaluator pool interface: candidates in, one frozen Evaluation per claimed shape out.

An :class:`EvaluatorPool` is what the engine (and ``evo eval``, the benchmarks, the RL loop)
hands candidates to. It compiles, checks and times them wherever it likes (threads and worker
processes here, Ray tasks and actors on a cluster, a synthetic function in a test double) and
answers with :class:`~populations.Evaluation` records; it never writes the archive.

Only :meth:`EvaluatorPool.submit` is abstract. Everything else the engine uses has a documented
default here, so a caller never has to ask a pool whether it has a method: a pool that cannot
cancel queued work simply does nothing on :meth:`cancel_all`, one that does not know its GPUs
reports none. ``tests/test_pool_conformance.py`` runs the same contract over every pool.
"""
from __future__ import annotations

import abc
from concurrent.futures import Future
from typing import Any, Iterable, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Registry, Shape

from .._job import EliteThreshold

__all__ = ["EvaluatorPool", "POOLS"]


class EvaluatorPool(abc.ABC):
    """Base class of evaluator pools (``LocalPool``, ``RayPool``, test doubles).

    The contract every implementation keeps:

    - :meth:`submit` returns at once or blocks for back-pressure, never for the evaluation; its
      future resolves to one Evaluation per ``candidate.shapes``, in that order, each naming the
      candidate. A failure to evaluate is an Evaluation with a failure status, not an exception
      (a future that raises is the pool's own failure; the engine records it and carries on).
    - After :meth:`cancel_all` or :meth:`close`, :meth:`submit` raises ``RuntimeError``.
    - :meth:`close` may be called more than once; the pool is also a context manager.
    """

    #: Indices of the GPUs (or actor slots) the pool times on; empty when it cannot say.
    #: The engine sizes its in-flight window and its progress display from it.
    gpus: Sequence[int] = ()

    @abc.abstractmethod
    def submit(self, candidate: Candidate, *, elite_threshold: EliteThreshold = None) -> "Future[list[Evaluation]]":
        """Queue one candidate for evaluation.

        ``elite_threshold``: the device speedup the candidate must reach to become an elite of
        its shape now (one number, or per claimed shape: a mapping from the shape's string to a
        number or None); a pool may use it to skip work only a would-be elite needs (the
        workers' memoisation pass), or ignore it. None: no cutoff is known (the elite set is not
        full)."""

    @property
    def arch(self) -> Optional[str]:
        """The target GPU architecture (``sm_90a``, ``sm_80``...), None when the pool cannot say
        (the engine then uses its configured or default arch). May block until a worker is up."""
        return None

    def evaluate(self, candidates: Iterable[Candidate]) -> list[Evaluation]:
        """Evaluate all (submitted together, so they pipeline); Evaluations in candidate order,
        then shape order."""
        futures = [self.submit(c) for c in candidates]
        return [e for f in futures for e in f.result()]

    def set_shape_weights(self, weights: Mapping[Shape, float]) -> None:
        """The engine's allocation weights of its active shapes (headroom, ``evo/search/_budget.py``:
        evaluations will split in proportion to them), sent before each fill. A pool with
        several GPUs may place shapes by them (RayPool shards shapes across its actors so that
        each gets an even share of the expected GPU time); results never depend on them. The
        default ignores them: one queue feeding every GPU has nothing to place."""

    def cancel_all(self) -> None:
        """Drop the work that has not started (a run abandoning its in-flight candidates); their
        futures raise ``CancelledError``. The default drops nothing: the pool has no queue to cut."""

    def close(self) -> None:
        """Finish queued work (unless cancelled) and release workers. The default holds none."""

    def __enter__(self) -> "EvaluatorPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


#: The evaluator pools by name (``local``: GPU workers on this machine, ``ray``: a Ray cluster);
#: each pool class registers itself where it is defined.
POOLS: Registry[EvaluatorPool] = Registry("evaluator pool")
