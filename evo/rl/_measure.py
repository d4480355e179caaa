"""The evaluator in the loop of ``evo rl train --measure`` (online RL, issue 25).

Offline, a sampled knob edit that no archive measured has no reward: GRPO scores it with the
``unmapped`` penalty, the same as a failure, and so teaches the policy to repeat what was already
measured, the opposite of what a proposal operator is for (the 2026-12-03 adapter v1 did no better
than the base model). :class:`Measurer` gives such an edit its real reward: it submits a step's
new edits to an evaluator pool together (compiled side by side, timed one by one), records every
result in an archive of its own (crash-safe like any other: a later run reads them as rewards),
and hands the evaluations back to :class:`evo.rl._grpo.RewardSource`.

When the policy's model runs on one of the pool's GPUs it generates and trains under that GPU's
lease (:func:`colocated_gate`), the same arbitration ``evo run`` uses: no forward or backward pass
overlaps a timed region.
"""
from __future__ import annotations

import os
from concurrent.futures import Future
from typing import Any, Optional, Sequence, Union

from populations import Archive, Candidate, Evaluation

__all__ = ["Measurer", "colocated_gate"]


class Measurer:
    """``evaluate_many`` for :class:`~evo.rl._grpo.RewardSource` over ``pool``, recording into ``archive``."""

    def __init__(self, pool: Any, archive: Union[str, os.PathLike, Archive]) -> None:
        self.pool = pool
        self.archive = archive if isinstance(archive, Archive) else Archive(archive, mode="w")
        self.measured = 0
        self.lost = 0  # candidates whose evaluation raised (a worker lost): scored as unmeasured

    def evaluate_many(self, batch: Sequence[Candidate]) -> list[list[Evaluation]]:
        """Evaluations of each candidate (empty when its evaluation failed to come back)."""
        futures: list[Future] = [self.pool.submit(c) for c in batch]
        results: list[list[Evaluation]] = []
        for cand, fut in zip(batch, futures):
            try:
                evals = list(fut.result())
            except Exception:  # a crashed worker or a cancelled job: no reward, the run goes on
                self.lost += 1
                evals = []
            self.archive.record(cand, evals)
            results.append(evals)
        self.archive.commit()
        self.measured += len(batch)
        return results

    def close(self) -> None:
        self.archive.close()


def colocated_gate(device: str, pool_gpus: Sequence[int]) -> Optional[Any]:
    """The GPU lease the policy must hold when ``device`` is one of ``pool_gpus`` (None otherwise)."""
    from ..search import device_index

    gpu = device_index(device)
    if gpu is None or gpu not in pool_gpus:
        return None
    from evaluators import GpuLease, gpu_key

    return GpuLease(gpu_key(gpu))
