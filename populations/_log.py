"""A crash-safe, append-only record log: the file behind one shape's population.

Layout: an 8-byte file header (``b"EVOLOG"`` + a little-endian u16 format version), then frames::

    offset  size  field
    0       4     magic b"\\xe5voR"
    4       4     crc32 of everything after it: bytes 8..16, the key and the payload
    8       4     payload length (u32, little-endian)
    12      1     kind (1 candidate, 2 evaluation, 0 other)
    13      1     key length (u8): an index key chosen by the caller, so indexes need no decoding
    14      2     reserved, zero
    16      -     key (utf-8), then payload (populations codec bytes)

Why this shape: the checksum covers the length, so a damaged length is caught; the magic lets a
reader resynchronise after damage; kind and key in the header let :class:`RecordLog` index a
file of 100,000 records without decoding a single one (records are decoded lazily, on demand).

Durability: :meth:`RecordLog.append` buffers; :meth:`RecordLog.commit` writes the buffered frames
with one ``write`` and ``fsync``s. A crash can leave an incomplete or damaged last frame (a torn
tail): opening a writable log copies those bytes to a side file ``<log>.<offset>.torn`` and then
truncates them, with a warning naming the file, offset and bytes lost. A damaged frame followed by good ones
(the disk, not a crash, did that) is reported and skipped; everything after it stays readable.
A read-only log never truncates: it reads up to the last complete frame, which is what a reader
of a file that a writer is still growing must do, and :meth:`RecordLog.refresh` picks up more.
A new log is created complete (header written to a temporary file, fsynced, renamed, directory
fsynced); :func:`rewrite` replaces a log the same way (compaction).

Opening scans every frame, except where a side index (populations/_index.py, ``<log>.idx``,
written by the writer when it closes) describes the log exactly as it is: then the entries come
from the index and only frames after it are scanned; :meth:`RecordLog.read` checksums each
record it reads either way. Format v2 (this one) differs from v1 only in what archives put in
candidate keys; v1 logs are read and appended to as v1.
"""
from __future__ import annotations

import itertools
import logging
import os
import struct
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ._frames import (_FILE_HEADER, _FRAME, FILE_MAGIC, FILE_VERSION, FRAME_MAGIC, FRAME_SIZE, HEADER_SIZE,  # noqa: F401
                      KIND_CANDIDATE, KIND_EVALUATION, KIND_OTHER, MAX_PAYLOAD, Entry, _write_all,
                      atomic_write)  # re-exported: the log's format is its public face
from ._index import IndexInfo, load_index, read_index, save_index

__all__ = ["LogError", "Entry", "RecordLog", "rewrite", "atomic_write", "KIND_OTHER", "KIND_CANDIDATE", "KIND_EVALUATION"]

log = logging.getLogger(__name__)

_CHUNK = 8 << 20


class LogError(OSError):
    """A file that is not a record log, or a log that cannot be written."""


def frame(kind: int, key: str, payload: bytes) -> bytes:
    """One record's bytes on disk."""
    kb = key.encode()
    if len(kb) > 255:
        raise ValueError(f"record key is longer than 255 bytes: {key[:40]!r}...")
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"record of {len(payload)} bytes exceeds the {MAX_PAYLOAD}-byte limit")
    rest = struct.pack("<IBBH", len(payload), kind, len(kb), 0) + kb
    return FRAME_MAGIC + struct.pack("<I", zlib.crc32(payload, zlib.crc32(rest))) + rest + payload


@dataclass
class _Scan:
    entries: list[Entry] = field(default_factory=list)
    end: int = HEADER_SIZE                                          # just past the last good frame
    damaged: list[tuple[int, int]] = field(default_factory=list)   # skipped byte ranges


class _Window:
    """Reads a file region through a sliding buffer, so scanning needs little memory."""

    def __init__(self, fd: int, limit: int) -> None:
        self.fd, self.limit = fd, limit
        self.start, self.buf = 0, b""

    def get(self, pos: int, n: int) -> Optional[memoryview]:
        """``n`` bytes at ``pos``, or None when the file ends first."""
        if pos + n > self.limit:
            return None
        if not (self.start <= pos and pos + n <= self.start + len(self.buf)):
            self.start = pos
            self.buf = os.pread(self.fd, min(max(n, _CHUNK), self.limit - pos), pos)
            if len(self.buf) < n:  # the file shrank under us (a writer truncating its torn tail)
                return None
        return memoryview(self.buf)[pos - self.start: pos - self.start + n]

    def find_magic(self, pos: int) -> int:
        """Offset of the next frame magic at or after ``pos``, or -1."""
        while pos + len(FRAME_MAGIC) <= self.limit:
            view = self.get(pos, min(_CHUNK, self.limit - pos))
            if view is None:
                return -1
            hit = bytes(view).find(FRAME_MAGIC)
            if hit >= 0:
                return pos + hit
            pos += max(1, len(view) - len(FRAME_MAGIC) + 1)
        return -1


def _intact(buf: bytes, rel: int, base: int) -> Optional[Entry]:
    """The frame at ``buf[rel:]`` (file offset ``base + rel``) if it is whole and its crc and
    key check out, else None. One check for the fast scan and for resynchronisation."""
    if rel + FRAME_SIZE > len(buf):
        return None
    magic, crc, size, kind, klen, _reserved = _FRAME.unpack_from(buf, rel)
    stop = rel + FRAME_SIZE + klen + size
    if magic != FRAME_MAGIC or size > MAX_PAYLOAD or stop > len(buf):
        return None
    if zlib.crc32(memoryview(buf)[rel + 8:stop]) != crc:
        return None
    try:
        key = buf[rel + FRAME_SIZE:rel + FRAME_SIZE + klen].decode()
    except UnicodeDecodeError:
        return None
    return Entry(base + rel, kind, key, base + rel + FRAME_SIZE + klen, size)


def _frame_at(win: _Window, pos: int) -> Optional[Entry]:
    """The intact frame starting at ``pos``, or None."""
    head = win.get(pos, FRAME_SIZE)
    if head is None:
        return None
    size, klen = struct.unpack_from("<I", head, 8)[0], head[13]
    whole = win.get(pos, FRAME_SIZE + klen + size) if size <= MAX_PAYLOAD else None
    return None if whole is None else _intact(bytes(whole), 0, pos)


def _scan(fd: int, start: int, limit: int) -> _Scan:
    """Index every intact frame in ``[start, limit)``; skip damage by resynchronising on the magic.

    The loop over intact frames is the hot path (opening a log of 100,000 records), so it
    works on big buffers (8 MiB reads); anything unusual drops to :func:`_resync`."""
    out, pos = _Scan(end=start), start
    base, buf = start, b""
    while pos < limit:
        rel, avail = pos - base, len(buf)
        entry = _intact(buf, rel, base)
        if entry is not None:
            out.entries.append(entry)
            pos = out.end = entry.end
            continue
        want = FRAME_SIZE  # is the frame merely cut off by the end of the buffer?
        if rel + FRAME_SIZE <= avail:
            magic, _crc, size, _kind, klen, _reserved = _FRAME.unpack_from(buf, rel)
            whole = FRAME_SIZE + klen + size
            want = whole if magic == FRAME_MAGIC and size <= MAX_PAYLOAD and rel + whole > avail else 0
        if want and base + avail < limit:  # read on from this frame
            buf = os.pread(fd, min(limit - pos, max(_CHUNK, want)), pos)
            base = pos
            if len(buf) < min(limit - pos, max(_CHUNK, want)):
                limit = pos + len(buf)  # the file shrank under us (a writer cut its torn tail)
            continue
        nxt = _resync(fd, pos, limit)
        if nxt < 0:
            break  # nothing intact follows: a torn (or still growing) tail
        out.damaged.append((pos, nxt))
        pos = nxt
    return out


def _resync(fd: int, pos: int, limit: int) -> int:
    """Offset of the first intact frame after ``pos``, or -1."""
    win = _Window(fd, limit)
    nxt = win.find_magic(pos + 1)
    while nxt >= 0 and _frame_at(win, nxt) is None:
        nxt = win.find_magic(nxt + 1)
    return nxt


def _frames_in(fd: int, lo: int, hi: int) -> int:
    """How many frames began in the damaged region ``[lo, hi)`` (at least 1): the records it cost."""
    hits, pos, overlap = 0, lo, len(FRAME_MAGIC) - 1
    while pos < hi:
        buf = os.pread(fd, min(_CHUNK, hi - pos) + overlap, pos)
        hits += buf[:min(_CHUNK, hi - pos) + overlap].count(FRAME_MAGIC)
        pos += _CHUNK
    return max(1, hits)


def _index_says(index: Optional[IndexInfo]) -> str:
    return f"; {index.lost()}" if index else ""


def rewrite(path: str, frames: Iterable[bytes]) -> None:
    """Atomically replace (or create) the log at ``path`` with a header and ``frames`` (whole
    frames, e.g. copied verbatim by compaction). Only the writer calls this."""
    atomic_write(path, itertools.chain((_FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION),), frames))


class RecordLog:
    """One log file. ``writable=True`` recovers the file and appends; the caller guarantees a
    single writer (the archive's lock). Read-only logs take no lock and never modify the file."""

    def __init__(self, path: str, *, writable: bool = False, verify: bool = False) -> None:
        #: ``verify``: scan and checksum every frame even where the side index describes the log
        #: (the index is then only what the scan is compared against: records it lists that the
        #: log no longer holds are damage)
        self.path, self.writable, self.verify = path, writable, verify
        if writable and not os.path.exists(path):
            rewrite(path, ())
        self._fd = -1
        self.entries: list[Entry] = []
        self.damaged: list[tuple[int, int]] = []
        self._pending: list[bytes] = []
        self._pending_entries: list[Entry] = []
        #: bumped whenever the file is reopened after a replacement; indexes built on
        #: ``entries`` must then be rebuilt from scratch.
        self.generation = 0
        self._open()

    # -- opening and scanning -----------------------------------------------------------
    def _open(self) -> None:
        flags = os.O_RDWR | os.O_APPEND if self.writable else os.O_RDONLY
        try:
            self._fd = os.open(self.path, flags)
        except FileNotFoundError:
            raise LogError(f"{self.path}: no such log") from None
        header = os.pread(self._fd, HEADER_SIZE, 0)
        index = read_index(self.path)
        if len(header) < HEADER_SIZE or header[:6] != FILE_MAGIC:
            size = os.fstat(self._fd).st_size
            self.close()
            what = "empty (0 bytes)" if size == 0 else f"damaged header ({size} bytes, no evo log magic)"
            raise LogError(f"{self.path}: {what}: not an evo record log{_index_says(index)}")
        version = self.version = _FILE_HEADER.unpack(header)[1]
        if version > FILE_VERSION or version < 1:
            self.close()
            raise LogError(f"{self.path}: log format v{version} is unknown to this evo (v{FILE_VERSION}): a newer evo "
                           f"wrote it, or its header is damaged{_index_says(index)}")
        self._ino = os.fstat(self._fd).st_ino
        self.entries, self.damaged, self._end = [], [], HEADER_SIZE
        #: what opening repaired, one sentence each (a torn tail cut by a writer)
        self.recovered: list[str] = []
        #: damage found by comparing the log with its index (records the index lists, now gone)
        self.lost: list[str] = []
        self._lost_counts: dict[int, int] = {}  # damaged region start -> records it held (estimate)
        loaded = None if self.verify else load_index(self.path, self._fd, HEADER_SIZE, index)
        if loaded is not None:  # a log unchanged since its index: no scan
            self.entries, self._end = loaded
        self._indexed = self._end if loaded is not None else -1  # what the index on disk covers
        self._scan_more()
        if loaded is None and index is not None:
            self._compare(index)

    def _compare(self, index: IndexInfo) -> None:
        """Damage only an index can show: records it lists that the scan did not find (a log cut
        at a frame boundary reads as a shorter, intact log, so the scan alone cannot see it)."""
        msg = index.missing(self.entries, os.fstat(self._fd).st_size)
        if msg:
            self.lost.append(f"{self.path}: {msg}")
            warnings.warn(self.lost[-1], RuntimeWarning, stacklevel=4)
            log.warning(self.lost[-1])

    def _scan_more(self) -> None:
        size = os.fstat(self._fd).st_size
        scan = _scan(self._fd, self._end, size)
        for lo, hi in scan.damaged:
            self._lost_counts[lo] = _frames_in(self._fd, lo, hi)
            msg = f"{self.path}: skipped {hi - lo} damaged bytes at offset {lo} (corrupt record)"
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
            log.warning(msg)
        self.entries.extend(scan.entries)
        self.damaged.extend(scan.damaged)
        self._end = scan.end
        #: bytes past the last intact frame: a torn tail (cut at once by a writer) or, for a
        #: reader, possibly a frame still being written
        self.tail = size - scan.end
        if scan.end < size and self.writable:
            side = self._keep_tail(scan.end, size)
            msg = (f"{self.path}: torn tail: {size - scan.end} bytes lost at offset {scan.end} "
                   f"(kept in {os.path.basename(side)}); truncated")
            warnings.warn(msg, RuntimeWarning, stacklevel=4)
            log.warning(msg)
            self.recovered.append(msg)
            os.ftruncate(self._fd, scan.end)
            os.fsync(self._fd)
            self.tail = 0
            self._indexed = -1  # the cut changed the file: index it again

    def _keep_tail(self, start: int, stop: int) -> str:
        """Copy the bytes a writer is about to cut (``[start, stop)``) to a side file, durably,
        so a torn tail that was really a damaged record can still be looked at or salvaged."""
        side = f"{self.path}.{start}.torn"
        data = os.pread(self._fd, stop - start, start)
        atomic_write(side, (data,))
        return side

    def refresh(self) -> None:
        """Index frames added since the last look (a reader of a growing file). A log replaced
        by compaction is reopened and rescanned, and :attr:`generation` goes up."""
        try:
            replaced = os.stat(self.path).st_ino != self._ino
        except FileNotFoundError:
            replaced = False
        if replaced:
            os.close(self._fd)
            self._open()
            self.generation += 1
        else:
            self._scan_more()

    def problems(self, *, tail: bool = True) -> list[str]:
        """The damage seen in this log, one sentence each: skipped damaged regions, a torn
        tail a writer cut (and where its bytes were kept), or, for a reader, bytes past the
        last intact frame (a torn tail, or a frame a live writer is still writing)."""
        out = [f"{self.path}: {hi - lo} damaged bytes skipped at offset {lo} "
               f"(about {self._lost_counts.get(lo, 1)} record(s) lost)" for lo, hi in self.damaged]
        out += self.lost + self.recovered
        if self.tail and tail:
            out.append(f"{self.path}: torn tail: {self.tail} bytes at offset {self._end} are not a whole record "
                       "(a killed writer, or one still writing); the next writer keeps them in a .torn file")
        return out

    # -- reading --------------------------------------------------------------------------
    def read(self, entry: Entry) -> bytes:
        """The payload of an entry written to disk (pending entries have no bytes yet), its frame
        checksummed again (a log opened through its index was not scanned)."""
        raw = os.pread(self._fd, entry.end - entry.offset, entry.offset)
        if len(raw) != entry.end - entry.offset:
            raise LogError(f"{self.path}: record at offset {entry.offset} is gone (file replaced?)")
        if raw[:4] != FRAME_MAGIC or zlib.crc32(memoryview(raw)[8:]) != struct.unpack_from("<I", raw, 4)[0]:
            raise LogError(f"{self.path}: record at offset {entry.offset} is damaged (checksum mismatch)")
        return raw[entry.data_offset - entry.offset:]

    def save_index(self) -> None:
        """Writer: record the entries in the side index (populations._index) so the next open
        needs no scan; not for a log with damage (its next open scans and reports it again)."""
        if not self.writable or self.damaged or self.lost or self._pending or self._indexed == self._end:
            return
        save_index(self.path, self._fd, self.entries, self._end, HEADER_SIZE)
        self._indexed = self._end

    def raw(self, entry: Entry) -> bytes:
        """The whole frame of an on-disk entry, for copying it verbatim during compaction."""
        return os.pread(self._fd, entry.end - entry.offset, entry.offset)

    # -- writing --------------------------------------------------------------------------
    @property
    def pending(self) -> int:
        return len(self._pending)

    def append(self, kind: int, key: str, payload: bytes, *, durable: bool = False) -> Entry:
        """Buffer one record; with ``durable`` commit right away. Returns where it will sit."""
        if not self.writable:
            raise LogError(f"{self.path}: opened read-only")
        data = frame(kind, key, payload)
        offset = self._next_offset()
        entry = Entry(offset, kind, key, offset + len(data) - len(payload), len(payload))
        self._pending.append(data)
        self._pending_entries.append(entry)
        if durable:
            self.commit()
        return entry

    def _next_offset(self) -> int:
        last = self._pending_entries[-1] if self._pending_entries else None
        return last.end if last is not None else self._end

    def commit(self) -> None:
        """Write every buffered record with one write and fsync; afterwards they survive a crash.

        On an I/O error the file is cut back to its last committed length and the error raised;
        the buffered records are dropped (the caller decides whether to retry)."""
        if not self._pending:
            return
        data, entries = b"".join(self._pending), self._pending_entries
        self._pending, self._pending_entries = [], []
        try:
            _write_all(self._fd, data)
            os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, self._end)
            except OSError:
                pass
            raise
        self.entries.extend(entries)
        self._end = entries[-1].end

    def discard(self) -> None:
        """Drop buffered, uncommitted records."""
        self._pending, self._pending_entries = [], []

    @property
    def size(self) -> int:
        """Bytes of intact, committed log (header included)."""
        return self._end

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __repr__(self) -> str:
        return f"RecordLog({self.path!r}, writable={self.writable}, entries={len(self.entries)})"
