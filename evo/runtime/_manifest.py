"""An export's ``manifest.json`` as frozen records: :class:`ExportManifest`, one
:class:`KernelEntry` per exported kernel and its :class:`PreparedB` launcher.

``evo export`` builds the records and writes :meth:`ExportManifest.to_dict` (the JSON keys are
the ones the manifest always had); the loader reads them back with :meth:`ExportManifest.read`.
The record lives in the runtime wing, the lowest that needs it, so it imports the standard
library only. Keys an older export did not write read as their defaults; keys this version does
not know are kept (``extra``) and written back; a manifest that is not one is a one-line
:class:`ExportError`.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

__all__ = ["ExportError", "ExportManifest", "KernelEntry", "PreparedB", "MANIFEST_FORMAT", "LIBRARY", "MANIFEST_FILE"]

MANIFEST_FORMAT = "evo-export/1"
LIBRARY = "libevo_hgemm.so"
MANIFEST_FILE = "manifest.json"


class ExportError(Exception):
    """Bad input or a failed build: one line for the user, nothing left behind."""


def _fields(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")


def _split(cls: type, d: Mapping[str, Any], what: str, required: tuple[str, ...]) -> tuple[dict, dict]:
    """``d``'s known keys (as keyword arguments) and the rest; KeyError naming a missing required one."""
    if not isinstance(d, Mapping):
        raise TypeError(f"{what} is a {type(d).__name__}, not a map")
    missing = [k for k in required if k not in d]
    if missing:
        raise KeyError(f"{what} has no {missing[0]!r}")
    names = set(_fields(cls))
    return {k: v for k, v in d.items() if k in names}, {k: v for k, v in d.items() if k not in names}


@dataclass(frozen=True)
class PreparedB:
    """A kernel's launcher for a B the caller padded once (``prepared_b``: no per-call copy of B)."""

    symbol: str
    rows: int = 0
    cols: int = 0
    pitch_multiple: int = 8
    abi: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in _fields(PreparedB)}, **self.extra}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "PreparedB":
        known, extra = _split(cls, d, "prepared_b", ("symbol",))
        return cls(**known, extra=extra)


#: KernelEntry's fields written only when set (an older export wrote them never, or only then).
_OPTIONAL_ENTRY = ("prepared_b", "verify", "measurement")


@dataclass(frozen=True)
class KernelEntry:
    """One exported kernel: its shape and C symbol, what the loader needs to call it
    (``workspace_bytes``, ``prepared_b``), and the record of where it came from and how fast it
    was (candidate, sources' hashes, speedups, provenance, the measurement behind them)."""

    m: int
    n: int
    k: int
    layout: str
    symbol: str
    shape: str = ""
    key: str = ""
    workspace_bytes: int = 0
    contract: str = "f32"
    candidate: str = ""
    template: Optional[str] = None
    knobs: Optional[Mapping[str, Any]] = None
    operator: str = ""
    generation: int = 0
    source_sha256: str = ""
    unit_sha256: str = ""
    fitness: Optional[float] = None
    measurements: int = 0
    speedups: Mapping[str, float] = field(default_factory=dict)
    baselines: Mapping[str, str] = field(default_factory=dict)
    zero_workspace: bool = False
    tensor_maps: tuple[str, ...] = ()
    arch: str = ""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    measured_at: Optional[float] = None
    why: str = ""
    prepared_b: Optional[PreparedB] = None
    verify: Optional[Mapping[str, Any]] = None
    measurement: Optional[Mapping[str, Any]] = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in _fields(KernelEntry):
            value = getattr(self, name)
            if name in _OPTIONAL_ENTRY and value is None:
                continue
            out[name] = (value.to_dict() if isinstance(value, PreparedB) else list(value) if isinstance(value, tuple)
                         else dict(value) if isinstance(value, Mapping) else value)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "KernelEntry":
        known, extra = _split(cls, d, "a kernel entry", ("m", "n", "k", "layout", "symbol"))
        what = f"kernel {known['symbol']}"
        for name in ("m", "n", "k", "workspace_bytes"):
            if name in known and (not isinstance(known[name], int) or isinstance(known[name], bool)):
                raise ValueError(f"{what}: {name} is not an integer")
        if known.get("prepared_b") is not None:
            known["prepared_b"] = PreparedB.from_dict(known["prepared_b"])
        if "tensor_maps" in known:
            known["tensor_maps"] = tuple(known["tensor_maps"])
        return cls(**known, extra=extra)


@dataclass(frozen=True)
class ExportManifest:
    """An export: the library file and its architecture, the kernels in it, and for every shape
    of the archive the path it takes (``paths``), the shapes left to cuBLAS (``skipped``), the
    re-timing (``verify``), the archive damage gone past, and whether a test double's timings
    are behind it (``test_double``)."""

    arch: str
    kernels: tuple[KernelEntry, ...]
    format: str = MANIFEST_FORMAT
    library: str = LIBRARY
    evo: str = ""
    archive: str = ""
    skipped: tuple[Mapping[str, Any], ...] = ()
    paths: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    damage: tuple[str, ...] = ()
    test_double: bool = False
    verify: Mapping[str, Any] = field(default_factory=dict)
    fallback: str = ""
    abi: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``manifest.json``'s keys)."""
        out: dict[str, Any] = {}
        for name in _fields(ExportManifest):
            value = getattr(self, name)
            if name == "kernels":
                value = [e.to_dict() for e in value]
            elif name == "skipped":
                value = [dict(s) for s in value]
            out[name] = list(value) if isinstance(value, tuple) else dict(value) if isinstance(value, Mapping) else value
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> "ExportManifest":
        """Inverse of :meth:`to_dict`; ValueError, KeyError or TypeError on what is not a manifest."""
        if not isinstance(d, Mapping) or d.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"not an {MANIFEST_FORMAT} manifest")
        known, extra = _split(cls, d, "the manifest", ("arch", "kernels"))
        if not isinstance(known["kernels"], list):
            raise TypeError("kernels is not a list")
        known["kernels"] = tuple(KernelEntry.from_dict(e) for e in known["kernels"])
        for name in ("skipped", "damage"):
            if name in known:
                known[name] = tuple(known[name])
        return cls(**known, extra=extra)

    @classmethod
    def read(cls, folder: Union[str, Path]) -> "ExportManifest":
        """``folder/manifest.json`` as a record; :class:`ExportError` (one line) when it cannot be
        read or is not a manifest."""
        try:
            return cls.from_dict(json.loads((Path(folder) / MANIFEST_FILE).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise ExportError(f"{folder}: cannot read the export manifest: {msg}") from None

    def write(self, folder: Union[str, Path]) -> None:
        """Write ``folder/manifest.json`` (sorted keys, one-space indent: the format as it was)."""
        (Path(folder) / MANIFEST_FILE).write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True))
