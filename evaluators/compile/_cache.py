"""On-disk cache of compile outcomes, keyed by what determines the cubin.

Key: sha256 over the source, the full flag list, the arch, the back end and the toolkit
version (plus a format number). Value: one msgpack file holding the cubin, the ptxas log,
the compile seconds and the kernels the machine-code check found may wait on other CTAs. Writes are atomic (temporary file in the same folder, then
``os.replace``), so concurrent pool workers and crashes never leave a torn entry; an
unreadable entry is treated as a miss and removed. Nothing expires by itself: ``prune``
trims the folder to a size, least recently used first. Only compiler verdicts are cached (success
or a compile error), never timeouts or memory failures, which depend on the machine's load.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import msgpack

__all__ = ["CacheEntry", "CubinCache", "cache_key", "default_cache_dir"]

_FORMAT = 1


def default_cache_dir() -> Path:
    """``$EVO_CUBIN_CACHE``, else ``$XDG_CACHE_HOME/evo/cubin``, else ``~/.cache/evo/cubin``."""
    if os.environ.get("EVO_CUBIN_CACHE"):
        return Path(os.environ["EVO_CUBIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "evo" / "cubin"


def cache_key(source: str, flags: tuple[str, ...], arch: str, backend: str, toolkit: str) -> str:
    blob = json.dumps([_FORMAT, source, list(flags), arch, backend, toolkit], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass(frozen=True)
class CacheEntry:
    ok: bool
    cubin: bytes
    log: str
    seconds: float
    waits: tuple[tuple[str, str], ...] = ()  # (kernel, why): may wait on other CTAs (evaluators.compile._sass)


class CubinCache:
    """A folder of ``<key[:2]>/<key>.msgpack`` files."""

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else default_cache_dir()

    def _path(self, key: str) -> Path:
        return self.root / key[:2] / f"{key}.msgpack"

    def get(self, key: str) -> CacheEntry | None:
        path = self._path(key)
        try:
            data = msgpack.unpackb(path.read_bytes(), raw=False)
            entry = CacheEntry(bool(data["ok"]), bytes(data["cubin"]), str(data["log"]), float(data["seconds"]),
                               tuple((str(k), str(w)) for k, w in data.get("waits", ())))
            os.utime(path)  # a hit counts as recent use for prune()
            return entry
        except FileNotFoundError:
            return None
        except Exception:  # torn or foreign file: drop it and recompile
            path.unlink(missing_ok=True)
            return None

    def put(self, key: str, entry: CacheEntry) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = msgpack.packb({"ok": entry.ok, "cubin": entry.cubin, "log": entry.log,
                              "seconds": entry.seconds, "waits": [list(w) for w in entry.waits]}, use_bin_type=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".msgpack")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def size(self) -> int:
        """Bytes held by the cache's entries."""
        return sum(p.stat().st_size for p in self.root.glob("??/*.msgpack"))

    def prune(self, max_bytes: int) -> int:
        """Delete the least recently used entries (by mtime: written or hit) until at most
        ``max_bytes`` remain; return how many were removed. Safe while others use the cache:
        a removed entry is just a miss."""
        entries = []
        for p in self.root.glob("??/*.msgpack"):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            entries.append((st.st_mtime, st.st_size, p))
        entries.sort()
        total = sum(size for _, size, _ in entries)
        removed = 0
        for _, size, p in entries:
            if total <= max_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size
            removed += 1
        return removed
