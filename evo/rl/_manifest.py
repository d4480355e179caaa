"""An adapter version's ``evo-adapter.json`` as a frozen record (:class:`AdapterManifest`).

``train_adapter`` builds one and writes :meth:`AdapterManifest.write` (the JSON keys are the ones
the file always had); ``read_manifest`` reads one back. Keys an older version did not write read
as their defaults, keys this one does not know are kept (``extra``) and written back; a file that
is not an adapter manifest is a one-line ValueError.
"""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

__all__ = ["MANIFEST", "ADAPTER_FORMAT", "AdapterManifest"]

MANIFEST = "evo-adapter.json"
ADAPTER_FORMAT = "evo-adapter/1"


@dataclass(frozen=True)
class AdapterManifest:
    """One trained adapter version: ``version`` (N) and ``name`` (``vN-<first 12 hex of the
    adapter hash>``, what new candidates record as ``Candidate.adapter``), the ``seed``, the base
    model and its hash, the adapter's hash, the ``parent_adapter`` it started from, the training
    ``config`` (GRPO, LoRA, rewards), the ``dataset`` it saw (rows, groups, sha256), where its
    rewards came from, how long it trained and the per-step ``metrics``."""

    version: int
    name: str
    format: str = ADAPTER_FORMAT
    seed: Optional[int] = None
    base_model: str = ""
    base_model_hash: str = ""
    adapter_hash: str = ""
    parent_adapter: Optional[str] = None
    config: Mapping[str, Any] = field(default_factory=dict)
    dataset: Mapping[str, Any] = field(default_factory=dict)
    reward_sources: Mapping[str, int] = field(default_factory=dict)
    train_seconds: float = 0.0
    metrics: tuple[Mapping[str, Any], ...] = ()
    created: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``evo-adapter.json``'s keys)."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            out[f.name] = ([dict(m) for m in value] if f.name == "metrics"
                           else dict(value) if isinstance(value, Mapping) else value)
        out.update(self.extra)
        return out

    @classmethod
    def from_dict(cls, d: Any) -> "AdapterManifest":
        """Inverse of :meth:`to_dict`; ValueError on what is not an adapter manifest."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a manifest is a JSON object, not {type(d).__name__}")
        missing = [k for k in ("version", "name") if k not in d]
        if missing:
            raise ValueError(f"no {missing[0]!r}")
        if d.get("format", ADAPTER_FORMAT) != ADAPTER_FORMAT:
            raise ValueError(f"format {d['format']!r} is not {ADAPTER_FORMAT}")
        if not isinstance(d["version"], int) or isinstance(d["version"], bool) or not isinstance(d["name"], str):
            raise ValueError("version must be an integer and name a string")
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        known = {k: v for k, v in d.items() if k in names}
        try:
            known["metrics"] = tuple(dict(m) for m in known.get("metrics") or ())
        except (TypeError, ValueError):
            raise ValueError("metrics must be a list of objects") from None
        return cls(**known, extra={k: v for k, v in d.items() if k not in names})

    @classmethod
    def read(cls, folder: Union[str, os.PathLike]) -> "AdapterManifest":
        """``folder/evo-adapter.json``; ValueError (one line) when it is missing or not one."""
        try:
            return cls.from_dict(json.loads((Path(folder) / MANIFEST).read_text()))
        except (OSError, ValueError) as exc:
            raise ValueError(f"{folder} is not an evo adapter ({MANIFEST}: {exc})") from None

    def write(self, folder: Union[str, os.PathLike]) -> None:
        """Write ``folder/evo-adapter.json`` atomically (two-space indent, sorted keys, as it was)."""
        path = Path(folder) / MANIFEST
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
