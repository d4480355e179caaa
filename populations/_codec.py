"""Versioned msgpack encoding of records.

Every encoded record is a msgpack map ``{"v": SCHEMA_VERSION, "kind": ..., ...}``. Decoding
accepts every version up to the current one (older ones are upgraded here, in one place) and
refuses newer ones with a clear error rather than guessing.

Fields added later are written only when set, so a record without them encodes to the bytes it
always did: ``roofline_frac``, and ``measurement`` (an evaluation's :class:`Measurement`). Before
``measurement`` existed its keys sat in ``provenance``; decoding such a record moves them out
(:meth:`Measurement.lift`), so every reader finds them in one place.
"""
from __future__ import annotations

import functools
from typing import Any, Union

import msgpack

from ._plan import LaunchPlan
from ._records import Candidate, Evaluation, KernelStats, Measurement, Status, TimerResult
from ._shape import Shape

__all__ = ["SCHEMA_VERSION", "CodecError", "encode", "decode", "to_plain", "from_plain"]

SCHEMA_VERSION = 1
Record = Union[Candidate, Evaluation]


class CodecError(ValueError):
    """Bytes that are not a record this version of evo can read."""


def to_plain(record: Record) -> dict[str, Any]:
    """A record as plain msgpack/JSON-able data (also the ``evo inspect --json`` form)."""
    if isinstance(record, Candidate):
        return {
            "v": SCHEMA_VERSION, "kind": "candidate", "id": record.id,
            "source": record.source, "plan": record.plan.to_dict(),
            "shapes": [str(s) for s in record.shapes], "generic": record.generic,
            "template": record.template, "knobs": dict(record.knobs) if record.knobs is not None else None,
            "parents": list(record.parents), "operator": record.operator,
            "model": record.model, "adapter": record.adapter,
            "prompt": record.prompt, "completion": record.completion,
            "generation": record.generation, "created": record.created, "meta": dict(record.meta),
        }
    if isinstance(record, Evaluation):
        plain = {
            "v": SCHEMA_VERSION, "kind": "evaluation", "candidate_id": record.candidate_id,
            "shape": str(record.shape), "status": record.status.value, "message": record.message,
            "timers": {name: _timer_plain(t) for name, t in sorted(record.timers.items())},
            "kernels": [k.__dict__.copy() for k in record.kernels], "flags": list(record.flags),
            "max_error": record.max_error, "compile_s": record.compile_s,
            "correctness_s": record.correctness_s, "timing_s": record.timing_s,
            "arch": record.arch, "provenance": dict(record.provenance), "created": record.created,
        }
        if record.roofline_frac is not None:  # only when recorded: older records encode to the same bytes
            plain["roofline_frac"] = record.roofline_frac
        if record.measurement:
            plain["measurement"] = record.measurement.to_dict()
        return plain
    raise TypeError(f"cannot encode {type(record).__name__}")


def _timer_plain(t: TimerResult) -> dict[str, Any]:
    d = dict(t.__dict__)
    d["speedup"] = t.speedup
    return d


@functools.lru_cache(maxsize=1024)
def _shape(text: str) -> Shape:
    """Shape.parse, memoised: an archive's records name a handful of shapes thousands of times."""
    return Shape.parse(text)


def from_plain(d: Any) -> Record:
    """Inverse of :func:`to_plain`; raises :class:`CodecError` on anything malformed."""
    if not isinstance(d, dict):
        raise CodecError(f"a record must be a map, got {type(d).__name__}")
    version = d.get("v")
    if not isinstance(version, int) or version < 1:
        raise CodecError(f"record has no valid schema version: {version!r}")
    if version > SCHEMA_VERSION:
        raise CodecError(f"record schema v{version} is newer than this evo (v{SCHEMA_VERSION}); upgrade evo")
    try:
        kind = d["kind"]
        if kind == "candidate":
            return Candidate(
                id=d["id"], source=d["source"], plan=LaunchPlan.from_dict(d["plan"]),
                shapes=tuple(_shape(s) for s in d["shapes"]), generic=bool(d["generic"]),
                template=d.get("template"), knobs=d.get("knobs"), parents=tuple(d.get("parents") or ()),
                operator=d.get("operator", "seed"), model=d.get("model"), adapter=d.get("adapter"),
                prompt=d.get("prompt"), completion=d.get("completion"),
                generation=int(d.get("generation", 0)), created=float(d["created"]), meta=d.get("meta") or {},
            )
        if kind == "evaluation":
            timers = {}
            for name, t in (d.get("timers") or {}).items():
                t = {k: v for k, v in t.items() if k != "speedup"}
                timers[name] = TimerResult(**t)
            measurement, provenance = _measurement(d)
            return Evaluation(
                candidate_id=d["candidate_id"], shape=_shape(d["shape"]), status=Status(d["status"]),
                message=d.get("message", ""), timers=timers,
                kernels=tuple(KernelStats(**k) for k in d.get("kernels") or ()),
                flags=tuple(d.get("flags") or ()), max_error=d.get("max_error"),
                compile_s=float(d.get("compile_s", 0.0)), correctness_s=float(d.get("correctness_s", 0.0)),
                timing_s=float(d.get("timing_s", 0.0)), arch=d.get("arch", ""),
                provenance=provenance, created=float(d["created"]),
                roofline_frac=None if d.get("roofline_frac") is None else float(d["roofline_frac"]),
                measurement=measurement,
            )
    except CodecError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:  # timers not a map, inf generation
        raise CodecError(f"malformed {d.get('kind', 'record')}: {exc}") from None
    raise CodecError(f"unknown record kind {d.get('kind')!r}")


def _measurement(d: dict[str, Any]) -> tuple[Measurement, dict[str, Any]]:
    """An evaluation's measurement and provenance; a record from before ``measurement`` (its keys
    in the provenance, the pool wrote None for the unset ones) has them lifted out."""
    provenance = dict(d.get("provenance") or {})
    if d.get("measurement") is not None:
        return Measurement.from_dict(d["measurement"]), provenance
    return Measurement.lift(provenance)


def encode(record: Record) -> bytes:
    return msgpack.packb(to_plain(record), use_bin_type=True)


def decode(data: bytes) -> Record:
    try:
        plain = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types
        raise CodecError(f"not msgpack: {exc}") from None
    return from_plain(plain)
