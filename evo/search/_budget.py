"""Budgets, convergence and allocation: when a run (or one shape of it) should stop asking for
more work, and which shape gets the next proposal slot.

A :class:`Budget` counts what this run spent (wall time, GPU-seconds, evaluations, LLM tokens)
against optional limits. A :class:`Convergence` watches one shape's best fitness and says when
the last N evaluations brought no relative improvement larger than a threshold.

Allocation by headroom (issue 26): :func:`shape_weights` gives each shape a weight equal to its
headroom, ``1 - f`` where ``f`` is its best time's fraction of the floor-aware attainable time
(``populations.attainable_frac``; a shape not yet measured has headroom 1). A shape at
``saturated`` (default 0.9) or more of that limit, or stalled (no improvement over its last
``stall_window`` evaluations), has weight 0 and yields its slots to the others; when no shape
has a positive weight, all get the same (nothing has headroom: spread the budget evenly). A shape
with fewer than ``min_evals`` (default 8) evaluations has weight 1 whatever its headroom, so that
the first picks made for it are measured: in the random-shape benchmark's seed 7 (100 shapes, 312
s) mid shapes whose first result already sat near the roofline (cuBLAS at 0.8 of it, evo a few
percent below cuBLAS) had headroom 0.2-0.3 and got 1-4 evaluations where the others got 9-11,
and all of them stayed below cuBLAS (608x18688x8448: one evaluation, 0.94x). Nor is a shape
saturated while its best is slower than its baseline (that one sat at 0.90 of its attainable time
and yielded after its first result, where cuBLAS was 6% faster).
:func:`pick_shape` is weighted fair sharing: the shape whose evaluations (finished + in flight)
divided by its weight is smallest gets the next slot, so over time the evaluations split in
proportion to the weights.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Hashable, Mapping, Optional, Sequence, TypeVar

from populations import Evaluation

__all__ = ["Budget", "Convergence", "gpu_seconds", "AllocationConfig", "headroom", "shape_weights", "pick_shape"]

K = TypeVar("K", bound=Hashable)


def gpu_seconds(ev: Evaluation) -> float:
    """GPU time an evaluation used: its correctness and timing phases (compiling is CPU time)."""
    return max(0.0, float(ev.correctness_s)) + max(0.0, float(ev.timing_s))


@dataclass
class Budget:
    """Spending of this run against optional limits (None: unlimited)."""

    wall_s: Optional[float] = None
    gpu_s: Optional[float] = None
    evals: Optional[int] = None
    tokens: Optional[int] = None
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    used_gpu_s: float = 0.0
    used_evals: int = 0
    used_tokens: int = 0
    used_llm_gpu_s: float = 0.0  # of used_gpu_s: the LLM's own inference on a GPU (seconds it held the lease)
    used_llm_wait_s: float = 0.0  # not in used_gpu_s: seconds the LLM waited for the lease (issue 35)

    def __post_init__(self) -> None:
        self.started = self.clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def charge(self, evaluations: list[Evaluation]) -> None:
        """Count finished evaluations (every status counts: a failure spent the GPU too)."""
        self.used_evals += len(evaluations)
        self.used_gpu_s += sum(gpu_seconds(e) for e in evaluations)

    def charge_gpu(self, seconds: float) -> None:
        """GPU seconds spent outside evaluations: an LLM's inference on a GPU (issue 25)."""
        self.used_gpu_s += max(0.0, float(seconds))
        self.used_llm_gpu_s += max(0.0, float(seconds))

    def note_llm_wait(self, seconds: float) -> None:
        """Seconds an LLM waited for the GPU lease: reported beside its held seconds, charged to
        no budget (the timers held the GPU then, and their evaluations pay for it)."""
        self.used_llm_wait_s += max(0.0, float(seconds))

    def charge_tokens(self, tokens: int) -> None:
        self.used_tokens += max(0, int(tokens))

    def exhausted(self) -> Optional[str]:
        """The name of the first limit reached (``wall``, ``gpu_seconds``, ``evals``, ``tokens``), else None."""
        if self.wall_s is not None and self.elapsed >= self.wall_s:
            return "wall"
        if self.gpu_s is not None and self.used_gpu_s >= self.gpu_s:
            return "gpu_seconds"
        if self.evals is not None and self.used_evals >= self.evals:
            return "evals"
        if self.tokens is not None and self.used_tokens >= self.tokens:
            return "tokens"
        return None

    def remaining_evals(self, inflight: int) -> Optional[int]:
        """How many more candidates may be started without overshooting the evaluation limit."""
        if self.evals is None:
            return None
        return max(0, self.evals - self.used_evals - inflight)

    def summary(self) -> dict[str, float]:
        return {"wall_s": round(self.elapsed, 3), "gpu_s": round(self.used_gpu_s, 3),
                "evals": self.used_evals, "tokens": self.used_tokens, "llm_gpu_s": round(self.used_llm_gpu_s, 3),
                "llm_gpu_wait_s": round(self.used_llm_wait_s, 3)}


class Convergence:
    """Best-fitness history of one shape; converged when the last ``window`` evaluations improved
    the best by no more than ``threshold`` (relative), counting from the best seen before them."""

    def __init__(self, window: Optional[int], threshold: float) -> None:
        self.window = window
        self.threshold = threshold
        self.best: Optional[float] = None
        self._history: list[Optional[float]] = []  # best fitness after each evaluation, in order

    def observe(self, fitness: Optional[float]) -> bool:
        """Record one evaluation; True when it improved the best at all."""
        improved = fitness is not None and (self.best is None or fitness > self.best)
        if improved:
            self.best = fitness
        self._history.append(self.best)
        if self.window is not None and len(self._history) > self.window + 1:
            del self._history[: len(self._history) - self.window - 1]
        return improved

    @property
    def converged(self) -> bool:
        if self.window is None or len(self._history) <= self.window:
            return False
        before, now = self._history[0], self._history[-1]
        if now is None:
            return True  # a whole window without one valid result: nothing left to gain here
        if before is None:
            return False
        return now <= before * (1.0 + self.threshold)


@dataclass
class AllocationConfig:
    """Spending the budget where the headroom is (``[allocation]`` in the run's TOML)."""

    enabled: bool = True              # false: every active shape gets the same share (the old rule)
    saturated: float = 0.9            # attainable fraction from which a shape yields its slots
    stall_window: int = 64            # evaluations of a shape without improvement before it yields (0: never;
                                      # a shape with no ok result yet: a quarter of it, at least 8)
    stall_threshold: float = 0.005    # relative improvement of the best fitness that counts
    min_evals: int = 8                # evaluations a shape gets at full weight before its headroom counts


def headroom(frac: Optional[float]) -> float:
    """``1 - frac`` clipped to [0, 1]; 1 for a shape not measured yet (``None``)."""
    if frac is None:
        return 1.0
    return min(1.0, max(0.0, 1.0 - float(frac)))


def shape_weights(fracs: Mapping[K, Optional[float]], stalled: Optional[Mapping[K, bool]] = None,
                  saturated: float = 0.9, fresh: Optional[Mapping[K, bool]] = None,
                  behind: Optional[Mapping[K, bool]] = None) -> dict[K, float]:
    """Weight per shape of ``fracs`` (best attainable fraction, None when unmeasured): its
    headroom, 1 while ``fresh`` (fewer evaluations than ``AllocationConfig.min_evals``), 0 when
    ``stalled`` or at ``saturated`` or more (unless ``behind``: its best is still slower than its
    baseline, which shows that more is attainable); all 1 when none is positive."""
    stalled, fresh, behind = stalled or {}, fresh or {}, behind or {}
    out = {s: 0.0 if (f is not None and f >= saturated and not behind.get(s, False)) or stalled.get(s, False)
           else 1.0 if fresh.get(s, False) else headroom(f)
           for s, f in fracs.items()}
    if not any(w > 0 for w in out.values()):
        return {s: 1.0 for s in out}
    return out


def pick_shape(order: Sequence[K], loads: Mapping[K, int], weights: Mapping[K, float]) -> K:
    """The shape of ``order`` (non-empty) with the smallest ``load / weight`` among those with a
    positive weight (the earliest in ``order`` on ties); with none positive, the least loaded."""
    positive = [(i, s) for i, s in enumerate(order) if weights.get(s, 0.0) > 0]
    if not positive:
        return min(enumerate(order), key=lambda p: (loads.get(p[1], 0), p[0]))[1]
    return min(positive, key=lambda p: (loads.get(p[1], 0) / weights[p[1]], p[0]))[1]
