"""Frozen records handed between operators, evaluators, the engine and the archive.

A :class:`Candidate` is what an operator proposes: device source plus a launch plan, the shapes
it claims, and where it came from. An :class:`Evaluation` is what the evaluator measured of one
candidate at one shape. Records are immutable; the engine creates new ones, never edits.
"""
from __future__ import annotations

import enum
import hashlib
import json
import time
from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional

from ._plan import LaunchPlan
from ._shape import Shape

__all__ = ["Status", "Candidate", "Evaluation", "TimerResult", "KernelStats", "candidate_id"]

KnobValue = Any  # int | str | bool


class Status(str, enum.Enum):
    """Outcome of one evaluation. Only ``ok`` records have a fitness."""

    OK = "ok"
    REJECTED = "rejected"            # static scan or contract violation, never compiled
    COMPILE_ERROR = "compile_error"  # includes compile timeouts and memory blow-ups
    RUNTIME_ERROR = "runtime_error"  # launch failure, illegal access, trap, worker crash
    TIMEOUT = "timeout"              # a phase on the GPU overran its deadline
    INCORRECT = "incorrect"          # wrong results, touched inputs or memory beyond C
    FLAGGED = "flagged"              # correct but the timing looks like an exploit

    def __str__(self) -> str:
        return self.value


def candidate_id(source: str, plan: LaunchPlan, shapes: tuple[Shape, ...], generic: bool) -> str:
    """Content hash: two candidates with the same code, plan and claims are the same kernel."""
    h = hashlib.sha256()
    h.update(source.encode())
    h.update(json.dumps(plan.to_dict(), sort_keys=True).encode())
    h.update(",".join(str(s) for s in shapes).encode())
    h.update(b"generic" if generic else b"specialised")
    return h.hexdigest()[:20]


@dataclass(frozen=True)
class Candidate:
    """A proposed kernel.

    ``shapes`` are the shapes it claims and is checked at; ``generic`` claims every M, N, K of
    the first shape's layout and contract (then it is also checked on small ragged instances).
    """

    source: str
    plan: LaunchPlan
    shapes: tuple[Shape, ...]
    generic: bool = False
    template: Optional[str] = None
    knobs: Optional[Mapping[str, KnobValue]] = None
    parents: tuple[str, ...] = ()
    operator: str = "seed"
    model: Optional[str] = None
    adapter: Optional[str] = None
    prompt: Optional[str] = None
    completion: Optional[str] = None
    generation: int = 0
    created: float = field(default_factory=time.time)
    meta: Mapping[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.source, str) or not self.source.strip():
            raise ValueError("a candidate needs CUDA source")
        if not self.shapes:
            raise ValueError("a candidate must claim at least one shape")
        shapes = tuple(self.shapes)
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "parents", tuple(self.parents))
        if self.knobs is not None:
            object.__setattr__(self, "knobs", dict(sorted(self.knobs.items())))
        expected = candidate_id(self.source, self.plan, shapes, self.generic)
        if not self.id:
            object.__setattr__(self, "id", expected)
        elif self.id != expected:
            raise ValueError(f"candidate id {self.id} does not match its content ({expected})")

    def derive(self, **changes: Any) -> "Candidate":
        """A new candidate with some fields changed and the id recomputed."""
        return replace(self, id="", **changes)


@dataclass(frozen=True)
class TimerResult:
    """Candidate and cuBLAS baseline medians (seconds) for one timer, paired in one process."""

    median: float
    lo: float
    hi: float
    baseline_median: float
    baseline_lo: float
    baseline_hi: float
    samples: int
    baseline_name: str = "torch.matmul"

    @property
    def speedup(self) -> float:
        return self.baseline_median / self.median if self.median > 0 else 0.0


@dataclass(frozen=True)
class KernelStats:
    """What ptxas reported for one kernel of a candidate."""

    name: str
    registers: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    smem_static: int = 0
    stack_frame: int = 0
    cmem: int = 0


@dataclass(frozen=True)
class Evaluation:
    """One candidate measured at one shape."""

    candidate_id: str
    shape: Shape
    status: Status
    message: str = ""
    timers: Mapping[str, TimerResult] = field(default_factory=dict)
    kernels: tuple[KernelStats, ...] = ()
    flags: tuple[str, ...] = ()
    max_error: Optional[float] = None
    compile_s: float = 0.0
    correctness_s: float = 0.0
    timing_s: float = 0.0
    arch: str = ""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    #: roofline time (populations._roofline.roofline_time) / device-timer median, recorded by the
    #: engine with the archive's calibration; None when not measured (or an archive from before)
    roofline_frac: Optional[float] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", Status(self.status))
        object.__setattr__(self, "flags", tuple(self.flags))
        object.__setattr__(self, "kernels", tuple(self.kernels))

    @property
    def speedup(self) -> Optional[float]:
        """Device-timer speedup over cuBLAS (the fitness), or None when not measured."""
        t = self.timers.get("device")
        return t.speedup if t is not None else None

    @property
    def fitness(self) -> Optional[float]:
        """Speedup for an ``ok``, unflagged evaluation; None otherwise (never an elite)."""
        if self.status is not Status.OK or self.flags:
            return None
        return self.speedup

    @property
    def registers(self) -> int:
        return max((k.registers for k in self.kernels), default=0)

    @property
    def spills(self) -> int:
        return sum(k.spill_stores + k.spill_loads for k in self.kernels)
