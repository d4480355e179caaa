"""Rewards for RL from measured outcomes, and a table of them keyed by (shape, candidate id).

The reward of a candidate at a shape is the log of its median speedup over cuBLAS (its fitness)
when it was measured ``ok`` and unflagged, clipped to ``[floor, ceiling]`` so that a slow but
correct kernel still scores above any failure; a failure scores its status's penalty (never
positive). A flagged or incorrect measurement disqualifies the candidate whatever else was
measured, as in the archive's elite ranking, and a flagged one always scores ``flagged``
(the lowest: the policy must not learn to cheat).

``kind = "improvement"`` (issue 25, RL over many shapes): the reward is the child's improvement
over its parent in GPU time, ``log(parent device median / child device median)`` when positive
(clipped to ``ceiling``), and zero for an invalid or slower child or one whose parent has no
valid time at the shape; a flagged child still scores ``flagged``. Speedups over cuBLAS differ by
orders of magnitude between shapes; improvements over the parent do not, so groups from many
shapes train on one scale. The table learns each candidate's parent from the archive (or from
:meth:`RewardTable.set_parent` for fresh samples).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from populations import Archive, Evaluation, Shape, Status

__all__ = ["RewardConfig", "RewardTable", "reward_of", "improvement_of", "REWARD_KINDS"]

REWARD_KINDS = ("speedup", "improvement")


@dataclass(frozen=True)
class RewardConfig:
    """Penalties per failed status, the flagged penalty and the clip range of log speedups."""

    failure: Mapping[str, float] = field(default_factory=lambda: {
        "rejected": -1.0, "compile_error": -1.0, "runtime_error": -1.0, "timeout": -1.0, "incorrect": -1.0})
    flagged: float = -2.0
    floor: float = -0.9      # log(0.41x): correct but slow still beats a failure
    ceiling: float = 3.0     # log(20x): a broken baseline cannot dominate a group
    unmapped: float = -1.0   # a completion that maps to no measured candidate and no evaluator is given
    kind: str = "speedup"    # speedup: log speedup over cuBLAS; improvement: log gain over the parent (see above)

    def __post_init__(self) -> None:
        if self.kind not in REWARD_KINDS:
            raise ValueError(f"reward kind must be one of {REWARD_KINDS}, got {self.kind!r}")
        if any(v > 0 for v in self.failure.values()) or self.flagged > 0 or self.unmapped > 0:
            raise ValueError("failure, flagged and unmapped rewards must not be positive")
        if not self.flagged <= min(self.failure.values(), default=0.0):
            raise ValueError("the flagged reward must be the lowest")
        if not self.floor > max(self.failure.values(), default=-math.inf) or self.ceiling <= self.floor:
            raise ValueError("need max(failure) < floor < ceiling")

    def to_dict(self) -> dict[str, Any]:
        return {"failure": dict(self.failure), "flagged": self.flagged, "floor": self.floor,
                "ceiling": self.ceiling, "unmapped": self.unmapped, "kind": self.kind}


def _disqualified(evals: list[Evaluation], config: RewardConfig, incorrect: float) -> Optional[float]:
    """The reward that any evaluation decides alone: flagged (the lowest), else incorrect; None otherwise."""
    if any(e.flags or e.status is Status.FLAGGED for e in evals):
        return config.flagged
    if any(e.status is Status.INCORRECT for e in evals):
        return incorrect
    return None


def reward_of(evaluations: Iterable[Evaluation], config: RewardConfig = RewardConfig()) -> Optional[float]:
    """The reward of one candidate's evaluations at one shape (None when there are none)."""
    evals = list(evaluations)
    early = _disqualified(evals, config, config.failure.get("incorrect", -1.0))
    if early is not None or not evals:
        return early
    fits = [e.fitness for e in evals if e.fitness is not None and e.fitness > 0 and math.isfinite(e.fitness)]
    if fits:
        return min(max(math.log(statistics.median(fits)), config.floor), config.ceiling)
    last = evals[-1].status.value
    return config.failure.get(last, min(config.failure.values(), default=-1.0))


def _device_median(evals: Iterable[Evaluation]) -> Optional[float]:
    """The median device time of the valid (ok, unflagged) evaluations, None when there is none."""
    times = [e.timers["device"].median for e in evals
             if e.status is Status.OK and not e.flags and "device" in e.timers and e.timers["device"].median > 0]
    return statistics.median(times) if times else None


def improvement_of(evaluations: Iterable[Evaluation], parent: Iterable[Evaluation],
                   config: RewardConfig = RewardConfig(kind="improvement")) -> Optional[float]:
    """``max(0, log(parent time / child time))`` (clipped to ``ceiling``); 0 for an invalid or
    slower child or a parent without a valid time; ``flagged`` for a flagged child; None when
    the child has no evaluation."""
    evals = list(evaluations)
    early = _disqualified(evals, config, 0.0)
    if early is not None or not evals:
        return early
    child, base = _device_median(evals), _device_median(parent)
    if child is None or base is None:
        return 0.0
    return min(max(0.0, math.log(base / child)), config.ceiling)


class RewardTable:
    """Rewards of measured candidates, keyed by (shape, candidate id); the archive as reward source."""

    def __init__(self, config: RewardConfig = RewardConfig()) -> None:
        self.config = config
        self._evals: dict[tuple[Shape, str], list[Evaluation]] = {}
        self._fixed: dict[tuple[Shape, str], float] = {}
        self._parent: dict[tuple[Shape, str], str] = {}  # (shape, candidate) -> its first parent

    def add(self, evaluation: Evaluation) -> None:
        self._evals.setdefault((evaluation.shape, evaluation.candidate_id), []).append(evaluation)

    def add_archive(self, archive: Archive, shapes: Optional[Iterable[Shape]] = None) -> "RewardTable":
        for shape in (shapes if shapes is not None else archive.shapes()):
            for ev in archive.evaluations(shape):
                self.add(ev)
            if self.config.kind == "improvement":
                for c in archive.candidates(shape):
                    if c.parents:
                        self._parent[(shape, c.id)] = c.parents[0]
        return self

    def set_parent(self, shape: Shape, candidate_id: str, parent_id: str) -> None:
        """The parent a candidate's improvement is measured against (fresh samples of a group)."""
        self._parent[(shape, candidate_id)] = parent_id

    def set(self, shape: Shape, candidate_id: str, reward: float) -> None:
        """A reward known without its evaluations (a dataset row's)."""
        self._evals.pop((shape, candidate_id), None)
        self._fixed[(shape, candidate_id)] = reward

    def get(self, shape: Shape, candidate_id: str) -> Optional[float]:
        key = (shape, candidate_id)
        if key in self._evals:
            if self.config.kind == "improvement":
                parent = self._parent.get(key)
                return improvement_of(self._evals[key], self._evals.get((shape, parent), []) if parent else [],
                                      self.config)
            return reward_of(self._evals[key], self.config)
        return self._fixed.get(key)

    def __len__(self) -> int:
        return len(self._evals) + len(self._fixed)

    def __contains__(self, key: object) -> bool:
        return key in self._evals or key in self._fixed
