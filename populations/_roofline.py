"""Roofline arithmetic: how close a measured time is to what the hardware allows for a shape.

Two ceilings, on purpose:

- :func:`roofline_time` is issue 26's roofline, ``max(2MNK / peak, bytes / read_bw)`` with
  ``bytes = 2(MK + NK + MN)`` (A and B read once, C written once, fp16) and **no launch
  floor**. :func:`roofline_frac` (roofline time / measured time) is what every evaluation
  records and what ``evo inspect`` / ``evo report`` show. The bytes/s is HBM's read rate (an
  H200 reaches 4.5 TB/s with a streaming read kernel), not a copy's (4.3 TB/s, the figure the
  issue first wrote): GEMM traffic is almost all reads, so a weight-streaming kernel can reach
  the read rate and its fraction stays <= 1.
- :func:`attainable_time` is what the engine's budget allocation uses: ``max(2MNK / peak,
  bytes / read_bw, launch_floor)``. A tiny shape cannot finish faster than one kernel launch
  inside a CUDA graph, so without the floor a 1x576x576 kernel at 2.2 us would look 90 % short
  of its limit and soak up budget that a 4096-wide decode shape could use.

A :class:`Calibration` carries the four device figures (measured once per device by
``evaluators.run._calibrate``, stored beside an archive as ``calibration.json``);
:data:`H200_DEFAULTS` are the documented H200 figures used when nothing was measured.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from ._shape import Shape

__all__ = ["Calibration", "H200_DEFAULTS", "CALIBRATION_FILE", "roofline_time", "attainable_time",
           "roofline_frac", "attainable_frac", "read_calibration", "write_calibration"]

CALIBRATION_FILE = "calibration.json"
FORMAT = "evo-calibration/1"


@dataclass(frozen=True)
class Calibration:
    """Ceilings of one device. ``source`` is ``measured``, ``cached`` (copied from the per-device
    cache) or ``default`` (the documented H200 figures: no GPU, or measuring failed)."""

    peak_flops: float          # dense fp16 tensor FLOP/s (cuBLAS at 8192^3)
    read_bw: float             # HBM read bytes/s (a streaming read kernel)
    copy_bw: float             # bytes/s moved by an SM copy kernel (read + write counted); not in the roofline
    launch_floor_s: float      # seconds per launch of an empty kernel replayed in a CUDA graph
    device: str = "NVIDIA H200"
    source: str = "default"
    date: str = ""
    notes: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("peak_flops", "read_bw", "copy_bw"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"calibration {name} must be a positive number, got {v!r}")
        if not (math.isfinite(self.launch_floor_s) and self.launch_floor_s >= 0):
            raise ValueError(f"calibration launch_floor_s must be >= 0, got {self.launch_floor_s!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, **asdict(self), "notes": dict(self.notes)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Calibration":
        if d.get("format") != FORMAT:
            raise ValueError(f"not an {FORMAT} document (format {d.get('format')!r})")
        return cls(peak_flops=float(d["peak_flops"]), read_bw=float(d["read_bw"]), copy_bw=float(d["copy_bw"]),
                   launch_floor_s=float(d["launch_floor_s"]), device=str(d.get("device", "")),
                   source=str(d.get("source", "measured")), date=str(d.get("date", "")),
                   notes=dict(d.get("notes") or {}))

    def with_source(self, source: str) -> "Calibration":
        return replace(self, source=source)


#: The documented H200 figures (docs and ../shared/notes/anchors.md): 790 TFLOP/s from cuBLAS at
#: 8192^3, 4.5 TB/s HBM read by a weight-streaming kernel, 4.3 TB/s by a copy, ~2 us for an almost
#: empty kernel in a CUDA graph that reads from HBM.
H200_DEFAULTS = Calibration(peak_flops=790e12, read_bw=4.5e12, copy_bw=4.3e12, launch_floor_s=2e-6,
                            device="NVIDIA H200", source="default", date="2026-12-01")


def roofline_time(shape: Shape, cal: Calibration = H200_DEFAULTS) -> float:
    """Issue 26's roofline in seconds: ``max(2MNK / peak, 2(MK + NK + MN) / read_bw)``, no floor."""
    return max(shape.flops / cal.peak_flops, shape.min_bytes / cal.read_bw)


def attainable_time(shape: Shape, cal: Calibration = H200_DEFAULTS) -> float:
    """The floor-aware limit the budget allocation compares against: ``max(2MNK / peak,
    bytes / read_bw, launch_floor)``."""
    return max(shape.flops / cal.peak_flops, shape.min_bytes / cal.read_bw, cal.launch_floor_s)


def _frac(limit: float, seconds: Optional[float]) -> Optional[float]:
    if seconds is None or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0:
        return None
    return limit / seconds


def roofline_frac(shape: Shape, seconds: Optional[float], cal: Calibration = H200_DEFAULTS) -> Optional[float]:
    """:func:`roofline_time` / ``seconds`` (None for a missing or non-positive time)."""
    return _frac(roofline_time(shape, cal), seconds)


def attainable_frac(shape: Shape, seconds: Optional[float], cal: Calibration = H200_DEFAULTS) -> Optional[float]:
    """:func:`attainable_time` / ``seconds`` (None for a missing or non-positive time)."""
    return _frac(attainable_time(shape, cal), seconds)


def read_calibration(directory: Union[str, os.PathLike]) -> Optional[Calibration]:
    """The calibration stored in ``directory`` (an archive, or the per-device cache file's
    folder), or None when there is none or it cannot be read."""
    path = Path(directory)
    path = path if path.suffix == ".json" else path / CALIBRATION_FILE
    try:
        return Calibration.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def write_calibration(path: Union[str, os.PathLike], cal: Calibration) -> Path:
    """Write ``cal`` as JSON at ``path`` (a directory gets ``calibration.json``), atomically."""
    path = Path(path)
    if path.suffix != ".json":
        path = path / CALIBRATION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}")
    tmp.write_text(json.dumps(cal.to_dict(), indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path
