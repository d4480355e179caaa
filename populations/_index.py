"""A side index of a record log: its entries (offset, kind, key, size) up to a length, so that
opening a log of 100,000 records reads a few MB of index instead of checksumming 400 MB of frames.

File ``<log>.idx``::

    b"EVOIDX" u16 version | u64 covered length L | u64 the log's mtime (ns) | u32 crc32 of the
    log's last bytes before L | u32 entry count | u32 key bytes | count x (u64 offset, u32 payload size, u8 kind, u8 key length)
    | the keys, concatenated | u32 crc32 of everything before it

Why it can be trusted: the writer writes it (atomically, when it closes the archive) only for a
log without damage, from frames it checksummed; a reader uses it only while the log is exactly
as the index saw it: L bytes long, the same modification time, the same checksum of its last
bytes (a log appended to, rewritten, cut, copied or touched since is scanned in full, as
before). Anything else (no index, a stale or damaged one) means a full scan, never an error: the
index is a cache. Records read through it are still checksummed when read.
"""
from __future__ import annotations

import os
import struct
import zlib
from typing import NamedTuple, Optional

from ._frames import FRAME_SIZE, Entry, atomic_write

__all__ = ["INDEX_SUFFIX", "IndexInfo", "load_index", "orphans", "read_index", "save_index"]

INDEX_SUFFIX = ".idx"
_MAGIC = b"EVOIDX"
_VERSION = 1
_HEAD = struct.Struct("<6sHQQIII")
_ROW = struct.Struct("<QIBB")
_TAIL = 4096  # bytes of the log before L whose checksum ties the index to this log


def _tail_crc(fd: int, covered: int, header: int) -> int:
    start = max(header, covered - _TAIL)
    return zlib.crc32(os.pread(fd, covered - start, start))


def save_index(path: str, fd: int, entries: list, covered: int, header: int) -> None:
    """Write ``path``'s index for ``entries`` (populations._log.Entry, all before ``covered``)."""
    keys = [e.key.encode() for e in entries]
    rows = b"".join(_ROW.pack(e.offset, e.size, e.kind, len(k)) for e, k in zip(entries, keys))
    blob = b"".join(keys)
    mtime = os.fstat(fd).st_mtime_ns
    body = (_HEAD.pack(_MAGIC, _VERSION, covered, mtime, _tail_crc(fd, covered, header), len(entries), len(blob))
            + rows + blob)
    assert all(e.data_offset == e.offset + FRAME_SIZE + len(k) for e, k in zip(entries, keys))
    atomic_write(path + INDEX_SUFFIX, (body, struct.pack("<I", zlib.crc32(body))))


class IndexInfo(NamedTuple):
    """A whole, self-consistent index: what the log held when its writer closed it. Also what a
    damaged log is compared against (records the index lists that the log no longer holds)."""

    entries: list
    covered: int
    mtime: int
    tail_crc: int

    def missing(self, entries: list, size: int) -> str:
        """What this index lists that ``entries`` (a scan of the log, now ``size`` bytes) lacks, in one
        sentence (records, bytes, where); empty when nothing is missing."""
        found = {(e.offset, e.key) for e in entries}
        gone = [e for e in self.entries if (e.offset, e.key) not in found]
        if not gone:
            return ""
        cut = f"; the log is {size} bytes, the index recorded {self.covered}" if size < self.covered else ""
        return (f"{len(gone)} record(s) that the index lists are lost ({sum(e.end - e.offset for e in gone)} bytes "
                f"from offset {gone[0].offset}{cut})")

    def lost(self) -> str:
        """What the log held by this index, for a message about a log that cannot be read at all."""
        return f"its index lists {len(self.entries)} record(s) in {self.covered} bytes, all lost"


def orphans(directory: str, log_suffix: str) -> list[str]:
    """Side indexes in ``directory`` whose log is gone (a removed log the index still counts), one
    sentence each naming the log."""
    out = []
    for name in sorted(os.listdir(directory)):
        log_path = os.path.join(directory, name[: -len(INDEX_SUFFIX)])
        if name.endswith(log_suffix + INDEX_SUFFIX) and not os.path.exists(log_path):
            info = read_index(log_path)
            out.append(f"{log_path}: missing: " + (info.lost() if info else "its index is there, the records are lost"))
    return out


def read_index(path: str) -> Optional[IndexInfo]:
    """``path``'s index when the index file itself is whole (its checksum and sizes agree), whether
    or not it still describes the log; None when there is none or it is damaged."""
    try:
        with open(path + INDEX_SUFFIX, "rb") as fh:
            data = fh.read(64 << 20)
    except OSError:
        return None
    if len(data) < _HEAD.size + 4 or zlib.crc32(memoryview(data)[:-4]) != struct.unpack_from("<I", data, len(data) - 4)[0]:
        return None
    magic, version, covered, mtime, tail_crc, count, key_bytes = _HEAD.unpack_from(data)
    rows_end = _HEAD.size + count * _ROW.size
    if magic != _MAGIC or version != _VERSION or rows_end + key_bytes + 4 != len(data):
        return None
    keys = data[rows_end:rows_end + key_bytes]
    entries, pos = [], 0
    try:
        for offset, payload, kind, klen in _ROW.iter_unpack(memoryview(data)[_HEAD.size:rows_end]):
            start = offset + FRAME_SIZE + klen
            entries.append(Entry(offset, kind, keys[pos:pos + klen].decode(), start, payload))
            pos += klen
    except UnicodeDecodeError:
        return None
    if entries and entries[-1].end != covered:
        return None
    return IndexInfo(entries, covered, mtime, tail_crc)


def load_index(path: str, fd: int, header: int, info: Optional[IndexInfo] = None) -> Optional[tuple[list, int]]:
    """(entries, covered length) from ``path``'s index (``info``, read here when not given) when it
    is whole and describes this log as it is now; None otherwise (the caller scans)."""
    info = info if info is not None else read_index(path)
    if info is None:
        return None
    st = os.fstat(fd)
    if (info.covered < header or (st.st_size, st.st_mtime_ns) != (info.covered, info.mtime)
            or _tail_crc(fd, info.covered, header) != info.tail_crc):
        return None
    return info.entries, info.covered
