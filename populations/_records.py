"""Frozen records handed between operators, evaluators, the engine and the archive.

A :class:`Candidate` is what an operator proposes: device source plus a launch plan, the shapes
it claims, and where it came from. An :class:`Evaluation` is what the evaluator measured of one
candidate at one shape; its :class:`Measurement` says how it was measured (checks, rotations, the
timers' details), its ``provenance`` on what (GPU, driver, clocks, worker). Records are immutable;
the engine creates new ones, never edits.
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

__all__ = ["Status", "Candidate", "Evaluation", "Measurement", "MEASUREMENT_KEYS", "TimerResult", "KernelStats",
           "candidate_id"]

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


def _opt(kind: type, value: Any) -> Any:
    return None if value is None else kind(value)


@dataclass(frozen=True)
class Measurement:
    """How one evaluation was measured (the worker's detail, not the figures or the machine).

    ``checks``: the correctness checks passed, in order; ``phases``: seconds per step;
    ``rotation_sets``/``rotation_bytes``: the timing rotation; ``device_rotations``: the device
    timer's median per fresh rotation (``{"median", "baseline_median"}``, a precise job's);
    ``floor_s``: the physical floor the device time was held against; ``memo_check`` and
    ``host_timers``: what the elite gates decided (``"run"`` or why not); ``server_gaps_s``,
    ``device_warmup_s``, ``device_capture_s``, ``device_prewarm_replays``: the timers' own costs;
    ``device_rounds``/``device_rounds_planned``: the device timer's timed rounds run and planned
    (fewer run: the race stopped a candidate that could not become an elite); ``device_replays``/
    ``device_syncs``: the timed rounds' replays (all arms) and host synchronisations (their wall
    time's split is in ``phases``, ``device_sample_*``); ``gpu_lease``: what the timed region waited for the GPU lease. Archives written before this
    record kept these keys in ``Evaluation.provenance``; :meth:`lift` moves them here."""

    checks: tuple[str, ...] = ()
    phases: Mapping[str, float] = field(default_factory=dict)
    rotation_sets: Optional[int] = None
    rotation_bytes: Optional[int] = None
    device_rotations: tuple[Mapping[str, float], ...] = ()
    floor_s: Optional[float] = None
    memo_check: Optional[str] = None
    host_timers: Optional[str] = None
    server_gaps_s: Optional[float] = None
    device_warmup_s: Optional[float] = None
    device_capture_s: Optional[float] = None
    device_prewarm_replays: Optional[int] = None
    device_rounds: Optional[int] = None
    device_rounds_planned: Optional[int] = None
    device_replays: Optional[int] = None
    device_syncs: Optional[int] = None
    gpu_lease: Optional[Mapping[str, Any]] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", tuple(self.checks))
        object.__setattr__(self, "device_rotations", tuple(self.device_rotations))

    def __bool__(self) -> bool:
        """False when nothing was recorded (a failure before the GPU, or a test double's record)."""
        return bool(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        """Plain data (msgpack/JSON-able): the fields set, the empty and None ones left out."""
        out: dict[str, Any] = {}
        for name in MEASUREMENT_KEYS:
            value = getattr(self, name)
            if value is None or (isinstance(value, (tuple, Mapping)) and not value):
                continue
            if name == "device_rotations":
                value = [dict(r) for r in value]
            out[name] = list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Measurement":
        """Inverse of :meth:`to_dict` (None and missing keys read as unset); ValueError or
        TypeError on an unknown key or a value of the wrong kind."""
        unknown = sorted(set(d) - set(MEASUREMENT_KEYS))
        if unknown:
            raise ValueError(f"unknown measurement key(s) {unknown}")
        g = d.get
        return cls(checks=tuple(str(c) for c in g("checks") or ()),
                   phases={str(k): float(v) for k, v in dict(g("phases") or {}).items()},
                   rotation_sets=_opt(int, g("rotation_sets")), rotation_bytes=_opt(int, g("rotation_bytes")),
                   device_rotations=tuple({str(k): float(v) for k, v in dict(r).items()} for r in g("device_rotations") or ()),
                   floor_s=_opt(float, g("floor_s")), memo_check=_opt(str, g("memo_check")),
                   host_timers=_opt(str, g("host_timers")), server_gaps_s=_opt(float, g("server_gaps_s")),
                   device_warmup_s=_opt(float, g("device_warmup_s")), device_capture_s=_opt(float, g("device_capture_s")),
                   device_prewarm_replays=_opt(int, g("device_prewarm_replays")),
                   device_rounds=_opt(int, g("device_rounds")),
                   device_rounds_planned=_opt(int, g("device_rounds_planned")),
                   device_replays=_opt(int, g("device_replays")), device_syncs=_opt(int, g("device_syncs")),
                   gpu_lease=None if g("gpu_lease") is None else dict(g("gpu_lease")))

    @classmethod
    def lift(cls, provenance: Mapping[str, Any]) -> tuple["Measurement", dict[str, Any]]:
        """An old record's provenance split in two: the measurement keys it carried (read as
        :meth:`from_dict` reads them) and the rest, which is provenance proper."""
        found = {k: v for k, v in provenance.items() if k in MEASUREMENT_KEYS}
        rest = {k: v for k, v in provenance.items() if k not in MEASUREMENT_KEYS}
        return cls.from_dict(found), rest


#: Measurement's fields: also the keys an old record kept in its provenance.
MEASUREMENT_KEYS: tuple[str, ...] = ("checks", "phases", "rotation_sets", "rotation_bytes", "device_rotations",
                                     "floor_s", "memo_check", "host_timers", "server_gaps_s", "device_warmup_s",
                                     "device_capture_s", "device_prewarm_replays", "device_rounds",
                                     "device_rounds_planned", "device_replays", "device_syncs", "gpu_lease")


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
    #: the GPU, driver, clocks, code version and worker the figures were taken on
    provenance: Mapping[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    #: roofline time (populations._roofline.roofline_time) / device-timer median, recorded by the
    #: engine with the archive's calibration; None when not measured (or an archive from before)
    roofline_frac: Optional[float] = None
    #: how it was measured (checks, rotations, the timers' details); empty when it never reached a GPU
    measurement: Measurement = field(default_factory=Measurement)

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
