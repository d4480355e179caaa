"""The record log's on-disk constants and the durable-write primitive, below both the log
(populations/_log.py) and its side index (populations/_index.py), which import them from here, so
neither needs the other at import time (the layout itself is described in _log's docstring)."""
from __future__ import annotations

import os
import struct
from typing import Iterable, NamedTuple

__all__ = ["FILE_MAGIC", "FILE_VERSION", "FRAME_MAGIC", "HEADER_SIZE", "FRAME_SIZE", "MAX_PAYLOAD", "KIND_OTHER",
           "KIND_CANDIDATE", "KIND_EVALUATION", "Entry", "atomic_write"]

FILE_MAGIC = b"EVOLOG"
#: v2: candidate keys may carry a summary after the id (populations._archive.CandidateInfo), which
#: an evo that reads v1 would take for part of the id, so it must refuse the file instead.
FILE_VERSION = 2
_FILE_HEADER = struct.Struct("<6sH")
FRAME_MAGIC = b"\xe5voR"
_FRAME = struct.Struct("<4sIIBBH")
HEADER_SIZE = _FILE_HEADER.size
FRAME_SIZE = _FRAME.size
#: Largest payload accepted: far above any real record (a few KB), far below the u32 limit.
MAX_PAYLOAD = 64 << 20
KIND_OTHER, KIND_CANDIDATE, KIND_EVALUATION = 0, 1, 2


class Entry(NamedTuple):
    """Where one record sits: its frame's offset, kind, key and payload position."""

    offset: int
    kind: int
    key: str
    data_offset: int
    size: int

    @property
    def end(self) -> int:
        return self.data_offset + self.size


def _fsync_dir(path: str) -> None:
    fd = os.open(path or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def atomic_write(path: str, chunks: Iterable[bytes]) -> None:
    """Replace (or create) ``path`` with ``chunks`` so that a crash leaves the old file or the new
    one, never a mix: write beside it, fsync, rename over it, fsync the directory."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        batch: list[bytes] = []
        for data in chunks:
            batch.append(data)
            if len(batch) >= 256:
                _write_all(fd, b"".join(batch))
                batch.clear()
        _write_all(fd, b"".join(batch))
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path))
