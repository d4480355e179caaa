"""The worker contract as types: a :class:`Job` goes to a GPU worker, a :class:`Result` comes back.

Inside the parent both are frozen records; they become plain dicts only at the process boundary
(:meth:`Job.to_wire` before ``WorkerSupervisor.run``, :meth:`Result.from_wire` after it), because
the worker is a separate interpreter that must not depend on more than pickled builtins and the
``populations`` records. The worker side parses the same wire form with :meth:`Job.from_wire`, so
a misspelled option is refused instead of silently doing nothing. The supervisor itself stays a
transport of dicts: it also runs test handlers whose jobs are not GPU jobs.

Statuses are :class:`populations.Status` members everywhere; a ``str`` enum, so the wire form
(``"ok"``, ``"runtime_error"``...) is what it always was.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Mapping, Optional, Union

from populations import MEASUREMENT_KEYS, LaunchPlan, Measurement, Shape, Status

__all__ = ["Job", "Result", "ShapeResult", "ShapeDraft", "JOB_OPTIONS", "EliteThreshold"]

#: The speedup a candidate must reach to become an elite: one number for every shape it claims,
#: or per shape (its string) a number or None (no cutoff known there: the checks always run).
EliteThreshold = Union[float, Mapping[str, Optional[float]], None]


@dataclass(frozen=True)
class Job:
    """One candidate for a GPU worker: the compiled code, its plan and claims, and how to time it.

    The options after ``meta`` default to None, meaning "the harness's default" (documented in
    ``evaluators/run/_harness.py``); they are left out of the wire form when None."""

    cubin: bytes
    plan: LaunchPlan
    shapes: tuple[Shape, ...]
    generic: bool = False
    timers: tuple[str, ...] = ("device", "offline", "server")
    qps: float = 2000.0
    candidate_id: str = ""
    meta: Mapping[str, Any] = field(default_factory=dict)
    # -- options (None: the harness's default) --
    seed: Optional[int] = None             # the job's random stream (None: fresh)
    elite_threshold: EliteThreshold = None  # memo pass and host timers only at or above this (per shape)
    memo_check: Optional[bool] = None       # False: never run the memoisation pass
    race: Optional[bool] = None             # False: time every planned round (else a loser stops early)
    rotations: Optional[int] = None         # freshly allocated rotations the device timer runs on
    host_timers: Optional[str] = None       # "elites" (default) or "always"
    host_calls: Optional[int] = None        # calls per host timer
    rounds: Optional[int] = None            # fixed device-timer replays (else budget_s / max_rounds)
    budget_s: Optional[float] = None
    max_rounds: Optional[int] = None
    min_rounds: Optional[int] = None        # the budget's floor (evaluators.PRECISE_JOB: 12)
    settle_s: Optional[float] = None
    settle_min_s: Optional[float] = None
    prewarm: Optional[bool] = None
    deadlines: Optional[Mapping[str, float]] = None  # per-phase deadline overrides (the supervisor reads them)

    def with_options(self, options: Mapping[str, Any]) -> "Job":
        """This job with ``options`` set (TypeError naming an unknown one)."""
        unknown = sorted(set(options) - set(JOB_OPTIONS))
        if unknown:
            raise TypeError(f"unknown job option(s) {unknown}; known: {sorted(JOB_OPTIONS)}")
        return dataclasses.replace(self, **dict(options))

    def to_wire(self) -> dict[str, Any]:
        """The dict the worker receives (the harness's documented keys)."""
        out: dict[str, Any] = {"cubin": self.cubin, "plan": self.plan.to_dict(), "shapes": [str(s) for s in self.shapes],
                               "generic": self.generic, "timers": list(self.timers), "qps": self.qps,
                               "candidate_id": self.candidate_id, "meta": dict(self.meta)}
        for name in JOB_OPTIONS:
            value = getattr(self, name)
            if value is not None:
                out[name] = dict(value) if isinstance(value, Mapping) else value
        return out

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> "Job":
        """Parse a job dict (TypeError on a missing or unknown key)."""
        core = {"cubin", "plan", "shapes"}
        known = core | {"generic", "timers", "qps", "candidate_id", "meta"} | set(JOB_OPTIONS)
        missing, unknown = sorted(core - set(wire)), sorted(set(wire) - known)
        if missing or unknown:
            raise TypeError(f"not a worker job: missing {missing}, unknown {unknown}")
        rest = {k: wire[k] for k in known - core if k in wire}
        if "timers" in rest:
            rest["timers"] = tuple(rest["timers"])
        return cls(cubin=bytes(wire["cubin"]), plan=LaunchPlan.from_dict(wire["plan"]),
                   shapes=tuple(Shape.parse(s) for s in wire["shapes"]), **rest)


#: The names of :class:`Job`'s options (what ``LocalPool(job_options=...)`` may set).
JOB_OPTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Job)
                                     if f.name not in ("cubin", "plan", "shapes", "generic", "timers", "qps",
                                                       "candidate_id", "meta"))


@dataclass(frozen=True)
class ShapeResult:
    """One claimed shape's outcome as the worker reported it: the figures, the clocks read at the
    shape (``provenance``) and how it was measured (``measurement``, which the pool carries onto
    the :class:`populations.Evaluation`). Built in the worker by a :class:`ShapeDraft`; a
    record of populations types, so it pickles as it is."""

    shape: Shape
    status: Status
    message: str = ""
    flags: tuple[str, ...] = ()
    timers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # TimerResult fields per timer
    max_error: Optional[float] = None
    correctness_s: float = 0.0
    timing_s: float = 0.0
    provenance: Mapping[str, Any] = field(default_factory=dict)  # clocks read at this shape
    measurement: Measurement = field(default_factory=Measurement)
    fatal: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this parent does not read

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> "ShapeResult":
        """Parse the worker's dict: the measurement's keys sit at its top level."""
        known = set(_WIRE_KEYS) | set(MEASUREMENT_KEYS)
        return cls(shape=Shape.parse(wire["shape"]), status=Status(wire["status"]), message=str(wire.get("message") or ""),
                   flags=tuple(wire.get("flags") or ()), timers=dict(wire.get("timers") or {}),
                   max_error=wire.get("max_error"), correctness_s=float(wire.get("correctness_s") or 0.0),
                   timing_s=float(wire.get("timing_s") or 0.0),
                   provenance=dict(wire.get("provenance") or {}),
                   measurement=Measurement.from_dict({k: v for k, v in wire.items() if k in MEASUREMENT_KEYS}),
                   fatal=bool(wire.get("fatal")),
                   extra={k: v for k, v in wire.items() if k not in known})

    def to_wire(self) -> dict[str, Any]:
        """The dict the worker sends (the inverse of :meth:`from_wire`): builtins only, the
        measurement's unset figures left out, ``fatal`` only when set, the ``extra`` keys kept."""
        out: dict[str, Any] = {"shape": str(self.shape), "status": self.status, "message": self.message,
                               "flags": list(self.flags), "timers": {k: dict(v) for k, v in self.timers.items()},
                               "max_error": self.max_error, "correctness_s": self.correctness_s,
                               "timing_s": self.timing_s, "provenance": dict(self.provenance), "checks": []}
        out.update(self.measurement.to_dict())
        if self.fatal:
            out["fatal"] = True
        out.update(self.extra)
        return out

    def flagged(self, flag: str) -> "ShapeResult":
        """This result with one more hack flag: ``flagged`` where it was ``ok`` or ``flagged``
        (the message is left as it was), unchanged otherwise (a failure stays the failure)."""
        if self.status not in (Status.OK, Status.FLAGGED):
            return self
        return dataclasses.replace(self, status=Status.FLAGGED, flags=self.flags + (flag,))


#: The wire keys that are ShapeResult's own fields (the measurement's sit beside them).
_WIRE_KEYS = ("shape", "status", "message", "flags", "timers", "max_error", "correctness_s", "timing_s",
              "provenance", "fatal")


@dataclass
class ShapeDraft:
    """The worker's typed working copy of one shape's result while its phases run (correctness,
    then timing fill it in); :meth:`build` freezes it into a :class:`ShapeResult`. How it was
    measured goes on ``measurement`` through :meth:`note` (the record's own field names and
    types); ``phases`` is the one figure the steps add to as they go."""

    shape: Shape
    status: Status = Status.OK
    message: str = ""
    flags: list[str] = field(default_factory=list)
    timers: dict[str, dict[str, Any]] = field(default_factory=dict)
    max_error: Optional[float] = None
    correctness_s: float = 0.0
    timing_s: float = 0.0
    provenance: dict[str, Any] = field(default_factory=dict)
    fatal: bool = False
    phases: dict[str, float] = field(default_factory=dict)  # seconds per step, added to as the steps run
    measurement: Measurement = field(default_factory=Measurement)

    def note(self, **fields: Any) -> None:
        """Record measurement fields (TypeError naming one :class:`populations.Measurement` lacks)."""
        self.measurement = dataclasses.replace(self.measurement, **fields)

    def fail(self, status: Status, message: str, **changes: Any) -> "ShapeDraft":
        """End the shape with ``status`` and ``message`` (and other fields, the measurement's
        included): this draft."""
        self.status, self.message = Status(status), message
        self.note(**{k: v for k, v in changes.items() if k in MEASUREMENT_KEYS})
        for name, value in changes.items():
            if name not in MEASUREMENT_KEYS:
                if name not in _DRAFT_FIELDS:
                    raise TypeError(f"ShapeDraft has no field {name!r}")
                setattr(self, name, value)
        return self

    def build(self) -> ShapeResult:
        """The frozen record of what the phases filled in."""
        measurement = Measurement.from_dict({**self.measurement.to_dict(), "phases": self.phases})
        return ShapeResult(shape=self.shape, status=self.status, message=self.message, flags=tuple(self.flags),
                           timers={k: dict(v) for k, v in self.timers.items()},
                           max_error=self.max_error, correctness_s=self.correctness_s, timing_s=self.timing_s,
                           provenance=dict(self.provenance), measurement=measurement, fatal=self.fatal)


_DRAFT_FIELDS = frozenset(f.name for f in dataclasses.fields(ShapeDraft))


@dataclass(frozen=True)
class Result:
    """A job's outcome: the job's own status (``ok`` when it ran; else why not, for every shape it
    did not reach) and one :class:`ShapeResult` per shape finished, in claim order."""

    status: Status
    message: str = ""
    shapes: tuple[ShapeResult, ...] = ()
    seed: Optional[int] = None
    load_s: Optional[float] = None
    fatal: bool = False
    phase: Optional[str] = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, wire: Mapping[str, Any]) -> "Result":
        """Parse a result dict; a dict without a status reads as a runtime error."""
        names = {"status", "message", "shapes", "seed", "load_s", "fatal", "phase"}
        return cls(status=Status(wire.get("status") or Status.RUNTIME_ERROR), message=str(wire.get("message") or ""),
                   shapes=tuple(ShapeResult.from_wire(r) for r in wire.get("shapes") or ()),
                   seed=wire.get("seed"), load_s=wire.get("load_s"), fatal=bool(wire.get("fatal")),
                   phase=wire.get("phase"), extra=MappingProxyType({k: v for k, v in wire.items() if k not in names}))

    def shape(self, shape: Shape) -> Optional[ShapeResult]:
        """The result for ``shape``, None when the job did not reach it."""
        return next((r for r in self.shapes if r.shape == shape), None)
