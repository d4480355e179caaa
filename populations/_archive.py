"""The archive: every candidate and evaluation evo made, one crash-safe record log per shape.

Directory layout::

    DIR/archive.json            {"format": "evo-archive", "version": 1}: marks the directory
    DIR/.lock                   flock()ed by the one writer (holds its pid, for the error message)
    DIR/<Shape.key>.evolog      one shape's population (see populations._log for the format)

A shape's log holds the candidates that claim the shape and every evaluation at the shape, so
each log stands alone: a candidate claiming three shapes is written to three logs, and an
evaluation at a shape its candidate does not claim copies the candidate there first.

Exactly one writer (``mode="w"``) holds an exclusive ``flock``; a second gets
:class:`ArchiveLockedError`. Readers (``mode="r"``) take no lock, never modify a file, read up to
the last complete record and see more after :meth:`Archive.refresh`. Resuming = reopening with
``mode="w"``: torn tails left by a crash are truncated on open, their bytes first kept in a side
file ``<log>.<offset>.torn`` (with a warning). Damage stays where it is: a shape log that cannot
be opened, or a record that does not decode, is reported by :meth:`Archive.problems` and skipped,
and every other shape and record reads as before.

Records are frozen :class:`Candidate` / :class:`Evaluation` values in and out; they are decoded
lazily (an index of ids and kinds is built from frame headers) and cached once decoded.
"""
from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import statistics
import weakref
from collections import Counter, OrderedDict
from dataclasses import dataclass
import socket
import time
from typing import Callable, Iterable, Iterator, NamedTuple, Optional, Union

from ._codec import CodecError, decode, encode
from ._index import INDEX_SUFFIX
from ._log import KIND_CANDIDATE, KIND_EVALUATION, Entry, LogError, RecordLog, atomic_write, rewrite
from ._records import Candidate, Evaluation, Status
from ._shape import Shape, ShapeError

__all__ = ["Archive", "ArchiveError", "ArchiveLockedError", "CandidateInfo", "Elite", "LineageNode"]

FORMAT = "evo-archive"
VERSION = 1
MANIFEST = "archive.json"
LOCK = ".lock"
SUFFIX = ".evolog"
Record = Union[Candidate, Evaluation]
ShapeLike = Union[Shape, str]
#: An evaluation with one of these outcomes says the *code* is wrong or cheating, so it
#: disqualifies its candidate at that shape whatever its other measurements say.
DISQUALIFYING = frozenset({Status.INCORRECT, Status.FLAGGED})
#: Decoded candidates kept per shape; more are re-read from disk when asked for.
CANDIDATE_CACHE = 4096
#: Bytes of the lock file's holder record (JSON: pid, host, since), written in place.
LOCK_WIDTH = 160


def _why(exc: BaseException) -> str:
    """An OS error as a short sentence (``Permission denied``), else the exception's text."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _holder(raw: bytes) -> str:
    """Who holds the lock, from the lock file's record (older evo wrote the pid alone)."""
    text = raw.decode(errors="replace").strip()
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (ValueError, TypeError, KeyError):
        return f"pid {text or '?'}"


#: Writers open in this process. A child forked while one is open must not keep its lock (the
#: lock would outlive the parent) nor write through it: the hook below closes it in the child.
_WRITERS: "weakref.WeakSet[Archive]" = weakref.WeakSet()


def _drop_locks_in_child() -> None:
    for archive in list(_WRITERS):
        if archive._lock_fd >= 0:
            os.close(archive._lock_fd)
            archive._lock_fd = -1  # the child's copy is closed: writes there raise "closed"


os.register_at_fork(after_in_child=_drop_locks_in_child)


class ArchiveError(Exception):
    """A directory that is not an archive, or an archive used in a way it cannot be."""


class ArchiveLockedError(ArchiveError):
    """Another process holds the archive open for writing. Not corruption: wait, or read."""


@dataclass(frozen=True)
class Elite:
    """One candidate's standing at one shape.

    ``fitness`` is the **median** of :attr:`Evaluation.fitness` over the candidate's ``ok``,
    unflagged evaluations at the shape (``evaluations``, in archive order), so one lucky or
    unlucky re-measurement does not decide its rank.
    """

    candidate_id: str
    fitness: float
    evaluations: tuple[Evaluation, ...]
    candidate: Optional[Candidate]  # None only if its record was lost to corruption

    @property
    def latest(self) -> Evaluation:
        """The most recently archived of its ok evaluations (for timings and kernel stats)."""
        return self.evaluations[-1]


@dataclass(frozen=True)
class LineageNode:
    """A candidate and, recursively, the candidates it was made from (``Candidate.parents``).

    ``candidate`` is None for a parent that is not in the archive. Through crossover a
    candidate can appear twice in one ancestry; its second appearance has ``repeated=True``
    and no parents listed (they are under the first).
    """

    candidate_id: str
    candidate: Optional[Candidate]
    shapes: tuple[Shape, ...]
    parents: tuple["LineageNode", ...] = ()
    repeated: bool = False

    def walk(self) -> Iterator[tuple[int, "LineageNode"]]:
        """(depth, node) in depth-first order, without recursion (ancestries can be deep)."""
        stack = [(0, self)]
        while stack:
            depth, node = stack.pop()
            yield depth, node
            stack.extend((depth + 1, p) for p in reversed(node.parents))


class _Summary(NamedTuple):
    """What ranking needs of an evaluation. It is the evaluation frame's key (written from the
    record itself, checksummed with it), so counting and ranking 50,000 evaluations decode none."""

    candidate_id: str
    status: Status
    flagged: bool
    fitness: Optional[float]

    @classmethod
    def of(cls, ev: Evaluation) -> "_Summary":
        return cls(ev.candidate_id, ev.status, bool(ev.flags), ev.fitness)

    def key(self) -> str:
        fit = "-" if self.fitness is None else repr(self.fitness)
        return f"{self.candidate_id}\t{self.status.value}\t{int(self.flagged)}\t{fit}"

    @classmethod
    def parse(cls, key: str) -> Optional["_Summary"]:
        parts = key.rsplit("\t", 3)
        if len(parts) != 4 or parts[1] not in _STATUSES:
            return None  # not a summary key: the caller decodes the record instead
        try:
            fitness = None if parts[3] == "-" else float(parts[3])
        except ValueError:
            return None
        return cls(parts[0], _STATUSES[parts[1]], parts[2] == "1", fitness)


_STATUSES = {s.value: s for s in Status}


class CandidateInfo(NamedTuple):
    """What listing a population needs of a candidate without decoding it (the LLM-adapter
    statistics of ``evo inspect`` above all): it rides in the candidate frame's key, after the id.
    Keys written before this existed hold the id alone; their info is decoded when asked for."""

    id: str
    model: Optional[str]
    adapter: Optional[str]
    parent: Optional[str]          # the first parent
    created: float

    @classmethod
    def of(cls, c: Candidate) -> "CandidateInfo":
        return cls(c.id, c.model, c.adapter, c.parents[0] if c.parents else None, c.created)

    def key(self) -> str:
        """``id<TAB>`` for a candidate without a model (the common case), else every field;
        the id alone when that would not fit a key (255 bytes)."""
        if not self.model:
            return f"{self.id}\t"
        key = "\t".join((self.id, self.model, self.adapter or "", self.parent or "", repr(self.created)))
        return key if len(key.encode()) <= 255 else self.id

    @staticmethod
    def parse(key: str) -> tuple[str, Optional["CandidateInfo"]]:
        """(candidate id, its info or None when the key does not carry it)."""
        cid, tab, rest = key.partition("\t")
        if not tab:
            return cid, None
        if not rest:
            return cid, _NO_MODEL
        parts = rest.split("\t")
        try:
            return cid, CandidateInfo(cid, parts[0], parts[1] or None, parts[2] or None, float(parts[3]))
        except (IndexError, ValueError):
            return cid, None


#: The info of a candidate without a model: nothing else about it is needed without decoding.
_NO_MODEL = CandidateInfo("", None, None, None, 0.0)


class _Population:
    """The index of one shape's log (candidate id -> entry, evaluation entries and their ranking
    summaries) and the decoded records: evaluations once decoded (small), committed
    candidates in a bounded LRU (their sources are KBs each; a long run must not hoard them),
    and whatever the writer appended but has not committed yet (not on disk to re-read)."""

    def __init__(self, shape: Shape, log: RecordLog, problems: Optional[list[str]] = None) -> None:
        self.shape, self.log = shape, log
        #: where records that cannot be decoded are reported (shared with the archive)
        self.problems = problems if problems is not None else []
        self.rebuild()

    def rebuild(self) -> None:
        self.cands: dict[str, Entry] = {}
        self.infos: dict[str, Optional[CandidateInfo]] = {}
        self.evals: list[Entry] = []
        self.sums: list[Optional[_Summary]] = []  # parallel to evals
        self.objects: dict[int, Record] = {}
        self.recent: OrderedDict[int, Record] = OrderedDict()
        self.unsaved: list[Entry] = []
        self.generation, self.seen = self.log.generation, 0
        self.sync()

    def sync(self) -> None:
        """Index what the log gained since the last look (or everything, after a replacement)."""
        if self.log.generation != self.generation:
            self.rebuild()
            return
        for entry in self.log.entries[self.seen:]:
            self.index(entry)
        self.seen = len(self.log.entries)

    def index(self, entry: Entry, record: Optional[Record] = None) -> None:
        if entry.kind == KIND_CANDIDATE:
            cid, info = CandidateInfo.parse(entry.key)
            if cid not in self.cands:
                self.cands[cid] = entry
                self.infos[cid] = info
        elif entry.kind == KIND_EVALUATION:
            self.evals.append(entry)
            self.sums.append(_Summary.parse(entry.key))
        if record is not None:  # appended by the writer, on disk only after commit
            self.objects[entry.offset] = record
            self.unsaved.append(entry)

    def committed(self) -> None:
        """The writer's records are on disk now: their candidates may be evicted and re-read."""
        for entry in self.unsaved:
            if entry.kind == KIND_CANDIDATE:
                self._remember(entry.offset, self.objects.pop(entry.offset))
        self.unsaved = []
        self.seen = len(self.log.entries)

    def _remember(self, offset: int, record: Record) -> None:
        self.recent[offset] = record
        self.recent.move_to_end(offset)
        if len(self.recent) > CANDIDATE_CACHE:
            self.recent.popitem(last=False)

    def get(self, entry: Entry) -> Record:
        record = self.objects.get(entry.offset)
        if record is not None:
            return record
        record = self.recent.get(entry.offset)
        if record is not None:
            self.recent.move_to_end(entry.offset)
            return record
        try:
            record = decode(self.log.read(entry))
        except (CodecError, ValueError, TypeError, KeyError) as exc:
            raise ArchiveError(f"{self.log.path}: record at offset {entry.offset}: {exc}") from None
        want = Candidate if entry.kind == KIND_CANDIDATE else Evaluation
        if not isinstance(record, want):
            raise ArchiveError(f"{self.log.path}: record at offset {entry.offset} is not a {want.__name__}")
        if entry.kind == KIND_CANDIDATE:
            self._remember(entry.offset, record)
        else:
            self.objects[entry.offset] = record
        return record

    def find(self, entry: Entry) -> Optional[Record]:
        """:meth:`get`, except that a record which does not decode is reported (once) in
        :attr:`problems` and None returned: one bad record must not hide the rest."""
        try:
            return self.get(entry)
        except (ArchiveError, LogError) as exc:
            if str(exc) not in self.problems:
                self.problems.append(str(exc))
            return None

    def candidate_key(self, cand: Candidate) -> str:
        """The frame key of a candidate appended to this log: with its info in a v2 log, the id
        alone in a v1 log (an older evo reading that file must still find the id)."""
        return CandidateInfo.of(cand).key() if self.log.version >= 2 else cand.id

    def model_info(self, cid: str) -> Optional[CandidateInfo]:
        """The info of a candidate made by a model (an LLM), from its key or decoded; None for
        a candidate without a model (known from its key without decoding) or one that does not decode."""
        info = self.infos.get(cid)
        if info is None:
            cand = self.find(self.cands[cid])
            if cand is None:
                return None
            info = self.infos[cid] = CandidateInfo.of(cand) if cand.model else _NO_MODEL  # type: ignore[union-attr]
        return None if info is _NO_MODEL else info

    def summary(self, i: int) -> _Summary:
        """Evaluation ``i``'s summary, from its key, or decoded if the key is not one."""
        summary = self.sums[i]
        if summary is None:
            summary = self.sums[i] = _Summary.of(self.get(self.evals[i]))  # type: ignore[arg-type]
        return summary


def _as_shape(shape: ShapeLike) -> Shape:
    return shape if isinstance(shape, Shape) else Shape.parse(shape)


def _shape_of_file(name: str) -> Optional[Shape]:
    if not name.endswith(SUFFIX):
        return None
    try:
        return Shape.parse(name[: -len(SUFFIX)].replace("_", ":"))
    except ShapeError:
        return None


class Archive:
    """A directory of per-shape record logs. ``mode="r"`` reads (no lock), ``mode="w"`` writes.

    Writes are buffered: :meth:`add` / :meth:`record` append, :meth:`commit` makes everything
    appended so far durable (one write and fsync per touched shape), ``durable=True`` commits at
    once. :meth:`close` (and leaving a ``with`` block) commits. The writer's queries see its
    own uncommitted records; readers see what is on disk as of open or :meth:`refresh`.

    A commit is durable per shape log, not atomic across logs: a crash during a commit that
    touches two shapes can keep the batch in one and lose it (wholly or a suffix of it) in
    the other. Within a log, what survives is always a prefix of what was appended.
    """

    def __init__(self, path: Union[str, os.PathLike], mode: str = "r") -> None:
        if mode not in ("r", "w"):
            raise ValueError(f"mode must be 'r' or 'w', got {mode!r}")
        self.path, self.mode = os.path.abspath(os.fspath(path)), mode
        self._pops: dict[Shape, _Population] = {}
        self._bad: dict[Shape, str] = {}      # shape logs that cannot be opened, and why
        self._problems: list[str] = []        # records that do not decode
        self._lock_fd = -1
        if not os.fspath(path):
            raise ArchiveError("the archive path is empty; name a directory, e.g. runs/a")
        if "\0" in str(os.fspath(path)):
            raise ArchiveError(f"the archive path {os.fspath(path)!r} contains a NUL byte")
        if mode == "w":
            self._open_writer()
        else:
            self._check_manifest()

    # -- opening ----------------------------------------------------------------------------
    def _check_manifest(self) -> None:
        if not os.path.isdir(self.path):
            raise ArchiveError(f"{self.path}: no such archive directory")
        try:
            with open(os.path.join(self.path, MANIFEST), encoding="utf-8") as f:
                manifest = json.load(f)
        except FileNotFoundError:
            raise ArchiveError(f"{self.path}: not an evo archive (no {MANIFEST})") from None
        except (OSError, ValueError) as exc:  # ValueError: bad JSON or not UTF-8
            raise ArchiveError(f"{self.path}: unreadable {MANIFEST}: {_why(exc)}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ArchiveError(f"{self.path}: {MANIFEST} does not describe an evo archive")
        version = manifest.get("version")
        if not isinstance(version, int) or version > VERSION:
            raise ArchiveError(f"{self.path}: archive version {version!r} is newer than this evo (v{VERSION})")

    def _open_writer(self) -> None:
        try:
            self._create_dir()
        except OSError as exc:  # under a regular file, under /proc, read-only, no space: say which
            raise ArchiveError(f"{self.path}: cannot create or write the archive here: {_why(exc)}") from None

    def _create_dir(self) -> None:
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ArchiveError(f"{self.path}: not a directory")
        os.makedirs(self.path, exist_ok=True)
        fresh = not os.path.exists(os.path.join(self.path, MANIFEST))
        if fresh and set(os.listdir(self.path)) - {LOCK, MANIFEST + ".tmp"}:
            raise ArchiveError(f"{self.path}: not an evo archive and not empty; refusing to write there")
        self._lock()
        try:
            if fresh:
                data = json.dumps({"format": FORMAT, "version": VERSION}).encode()
                atomic_write(os.path.join(self.path, MANIFEST), (data,))
            self._check_manifest()
            for name in os.listdir(self.path):
                if name.endswith(".tmp"):  # an interrupted creation or compaction: never live data
                    os.unlink(os.path.join(self.path, name))
            for shape in self.shapes():  # recover every log now: resume starts clean
                self._pop(shape)
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        fd = os.open(os.path.join(self.path, LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(os.pread(fd, LOCK_WIDTH, 0))
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ArchiveLockedError(
                    f"{self.path} is being written by {holder}; one writer at a time: wait for it to "
                    "finish or stop it (Ctrl-C lets it commit), or read the archive meanwhile "
                    "(evo inspect needs no lock)") from None
            raise
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since})
        os.pwrite(fd, f"{text[:LOCK_WIDTH - 1]:<{LOCK_WIDTH - 1}}\n".encode(), 0)  # fixed width: no truncate
        self._lock_fd = fd
        _WRITERS.add(self)

    def _pop(self, shape: Shape, create: bool = False) -> Optional[_Population]:
        """A shape's population, opened on first use. A log that cannot be opened (empty, stray,
        not a log, unreadable) is damage to that shape alone: it is remembered in
        :meth:`problems` and the shape reads as empty; only writing to it is refused."""
        pop = self._pops.get(shape)
        if pop is None:
            if shape in self._bad:
                if create:
                    raise ArchiveError(f"{self._bad[shape]}; cannot add to shape {shape}: move that file away "
                                       "to start the shape afresh")
                return None
            path = os.path.join(self.path, shape.key + SUFFIX)
            if not os.path.exists(path) and not (create and self.mode == "w"):
                return None
            try:
                log = RecordLog(path, writable=self.mode == "w")
            except OSError as exc:  # LogError, or the OS refusing to open or read it
                self._bad[shape] = str(exc) if isinstance(exc, LogError) else f"{path}: {_why(exc)}"
                return self._pop(shape, create)
            pop = self._pops[shape] = _Population(shape, log, self._problems)
        return pop

    def problems(self, *, all_shapes: bool = True) -> list[str]:
        """Every piece of damage seen, one sentence each naming the file: shape logs that could
        not be opened, damaged regions skipped, torn tails (cut by a writer, kept in a side
        file, or pending for a reader), records that did not decode. With ``all_shapes`` every
        shape's log is opened first, so the list is complete."""
        if all_shapes:
            self._all_pops()
        out = list(self._bad.values())
        for pop in self._pops.values():
            out += pop.log.problems()
        return out + self._problems

    def _all_pops(self) -> list[_Population]:
        return [p for p in (self._pop(s) for s in self.shapes()) if p is not None]

    def refresh(self) -> None:
        """Reader: pick up records (and shapes) a concurrent writer committed since open."""
        for pop in self._pops.values():
            pop.log.refresh()
            pop.sync()

    # -- writing ----------------------------------------------------------------------------
    def _writer(self) -> None:
        if self.mode != "w":
            raise ArchiveError(f"{self.path}: opened read-only")
        if self._lock_fd < 0:
            raise ArchiveError(f"{self.path}: archive is closed")

    def add(self, record: Record, *, durable: bool = False) -> None:
        """Append a candidate (to every shape it claims) or an evaluation (to its shape).

        Idempotent for candidates: one already in a shape's log is not written again. An
        evaluation needs its candidate in this archive (add the candidate first)."""
        self._writer()
        if isinstance(record, Candidate):
            payload = None
            for shape in record.shapes:
                pop = self._pop(shape, create=True)
                assert pop is not None
                if record.id not in pop.cands:
                    payload = payload or encode(record)
                    pop.index(pop.log.append(KIND_CANDIDATE, pop.candidate_key(record), payload), record)
        elif isinstance(record, Evaluation):
            pop = self._pop(record.shape, create=True)
            assert pop is not None
            if record.candidate_id not in pop.cands:
                owner = self._find(record.candidate_id)
                if owner is None:
                    raise ArchiveError(f"evaluation of unknown candidate {record.candidate_id}: add the candidate first")
                cand = owner.get(owner.cands[record.candidate_id])
                pop.index(pop.log.append(KIND_CANDIDATE, pop.candidate_key(cand), encode(cand)), cand)  # type: ignore[arg-type]
            pop.index(pop.log.append(KIND_EVALUATION, _Summary.of(record).key(), encode(record)), record)
        else:
            raise TypeError(f"an archive stores Candidate and Evaluation records, not {type(record).__name__}")
        if durable:
            self.commit()

    def record(self, candidate: Candidate, evaluations: Iterable[Evaluation] = (), *, durable: bool = False) -> None:
        """Add a candidate and its evaluations in one step."""
        self.add(candidate)
        for evaluation in evaluations:
            self.add(evaluation)
        if durable:
            self.commit()

    def commit(self) -> None:
        """Make every appended record durable (write + fsync per shape log with pending records)."""
        self._writer()
        for pop in self._pops.values():
            if pop.log.pending:
                try:
                    pop.log.commit()
                except OSError:
                    pop.rebuild()  # forget the records that did not make it
                    raise
                pop.committed()

    def compact(self, shape: Optional[ShapeLike] = None, *,
                keep: Optional[Callable[[Record], bool]] = None) -> dict[Shape, tuple[int, int]]:
        """Rewrite logs without duplicate candidates, byte-identical duplicate evaluations,
        damaged regions, and records for which ``keep(record)`` is False (e.g. superseded ones).

        Each log is rewritten to a new file and renamed over the old one atomically (readers
        holding the old file keep reading it; :meth:`refresh` moves them to the new one).
        Returns {shape: (bytes before, bytes after)}."""
        self._writer()
        self.commit()
        pops = self._all_pops() if shape is None else [p for p in [self._pop(_as_shape(shape))] if p is not None]
        sizes = {}
        for pop in pops:
            before = os.path.getsize(pop.log.path)
            rewrite(pop.log.path, self._kept_frames(pop, keep))
            if os.path.exists(pop.log.path + INDEX_SUFFIX):
                os.unlink(pop.log.path + INDEX_SUFFIX)  # it describes the old file
            pop.log.close()
            pop.log = RecordLog(pop.log.path, writable=True)
            pop.rebuild()
            sizes[pop.shape] = (before, os.path.getsize(pop.log.path))
        return sizes

    @staticmethod
    def _kept_frames(pop: _Population, keep: Optional[Callable[[Record], bool]]) -> Iterator[bytes]:
        seen_ids: set[str] = set()
        seen_evals: set[bytes] = set()
        for entry in pop.log.entries:
            raw = pop.log.raw(entry)
            if entry.kind == KIND_CANDIDATE:
                cid = CandidateInfo.parse(entry.key)[0]
                if cid in seen_ids:
                    continue
                seen_ids.add(cid)
            else:
                digest = hashlib.blake2b(raw, digest_size=16).digest()
                if digest in seen_evals:
                    continue
                seen_evals.add(digest)
            if keep is None:
                yield raw
                continue
            record = pop.find(entry)
            if record is None or keep(record):  # an undecodable record is kept for a closer look
                yield raw

    def close(self) -> None:
        """Commit (writer), close every log and release the lock. Safe to call twice."""
        try:
            if self.mode == "w" and self._lock_fd >= 0:
                self.commit()
                for pop in self._pops.values():
                    try:
                        pop.log.save_index()
                    except OSError:  # the index is a cache: without it the next open scans
                        pass
        finally:
            for pop in self._pops.values():
                pop.log.close()
            self._pops.clear()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)  # closing the descriptor releases the flock
                self._lock_fd = -1

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ----------------------------------------------------------------------------
    def shapes(self) -> list[Shape]:
        """Shapes with a population in this archive, sorted."""
        found = {s for s in map(_shape_of_file, os.listdir(self.path)) if s is not None}
        return sorted(found | set(self._pops))

    def candidate_ids(self, shape: ShapeLike) -> list[str]:
        """Ids of the candidates in a shape's population, in archive order (no decoding)."""
        pop = self._pop(_as_shape(shape))
        return list(pop.cands) if pop else []

    def candidates(self, shape: ShapeLike) -> list[Candidate]:
        """Every candidate of a shape's population (decoded; one that does not decode is
        skipped and reported in :meth:`problems`)."""
        pop = self._pop(_as_shape(shape))
        return [c for c in map(pop.find, pop.cands.values()) if c is not None] if pop else []  # type: ignore[misc]

    def model_candidates(self, shape: ShapeLike) -> list[CandidateInfo]:
        """The candidates of a shape made by a model (an LLM), as :class:`CandidateInfo`, in
        archive order. Read from the frame keys: no candidate is decoded (except those of
        archives written before the keys carried it)."""
        pop = self._pop(_as_shape(shape))
        return [i for i in map(pop.model_info, pop.cands) if i is not None] if pop else []

    def evaluations_of(self, shape: ShapeLike, candidate_ids: Iterable[str]) -> dict[str, list[Evaluation]]:
        """{candidate id: its evaluations at the shape, in archive order} for the given ids,
        chosen on the ranking summaries: only those evaluations are decoded."""
        pop = self._pop(_as_shape(shape))
        wanted = set(candidate_ids)
        out: dict[str, list[Evaluation]] = {}
        for i in range(len(pop.evals) if pop else 0):
            cid = pop.summary(i).candidate_id  # type: ignore[union-attr]
            if cid in wanted:
                ev = pop.find(pop.evals[i])  # type: ignore[union-attr]
                if ev is not None:
                    out.setdefault(cid, []).append(ev)  # type: ignore[arg-type]
        return out

    def evaluations(self, shape: ShapeLike, candidate_id: Optional[str] = None) -> list[Evaluation]:
        """Evaluations at a shape in archive order, optionally of one candidate only."""
        pop = self._pop(_as_shape(shape))
        if pop is None:
            return []
        found = map(pop.find, pop.evals if candidate_id is None else
                    [pop.evals[i] for i in range(len(pop.evals)) if pop.summary(i).candidate_id == candidate_id])
        return [e for e in found if e is not None]  # type: ignore[misc]

    def status_counts(self, shape: ShapeLike) -> dict[Status, int]:
        """How many evaluations at a shape ended in each status (every status listed)."""
        counts = dict.fromkeys(Status, 0)
        pop = self._pop(_as_shape(shape))
        if pop is not None:
            counts.update(Counter(pop.summary(i).status for i in range(len(pop.evals))))
        return counts

    def elites(self, shape: ShapeLike, top: Optional[int] = 10) -> list[Elite]:
        """The best candidates at a shape, one row each, by median fitness (see :class:`Elite`).

        Only ``ok``, unflagged evaluations count; a candidate with any ``incorrect`` or
        ``flagged`` evaluation (or any flag) at the shape is no elite there at all. Other
        failures (timeouts, runtime errors) do not disqualify a candidate that also measured ok.
        Ties go to more measurements, then to the smaller id (a stable order)."""
        pop = self._pop(_as_shape(shape))
        if pop is None:
            return []
        ranked = self._ranked(pop, top)
        out = []
        for fit, cid, idx in ranked:  # a record that does not decode drops out of its row, not the table
            evals = tuple(e for e in (pop.find(pop.evals[i]) for i in idx) if e is not None)
            if evals:
                out.append(Elite(cid, fit, evals,  # type: ignore[arg-type]
                                 pop.find(pop.cands[cid]) if cid in pop.cands else None))  # type: ignore[arg-type]
        return out

    def fitness(self, shape: ShapeLike) -> dict[str, float]:
        """{candidate id: its elite fitness} for every candidate ranked at the shape (the
        fitness of :meth:`elites`, best first), from the summaries: nothing is decoded."""
        pop = self._pop(_as_shape(shape))
        return {cid: fit for fit, cid, _idx in self._ranked(pop)} if pop else {}

    @staticmethod
    def _ranked(pop: _Population, top: Optional[int] = None) -> list[tuple[float, str, list[int]]]:
        """(median fitness, id, evaluation indexes) of every elite, best first, ranked on the
        summaries (see :meth:`elites` for the rules)."""
        good: dict[str, list[int]] = {}
        banned: set[str] = set()
        for i in range(len(pop.evals)):
            sm = pop.summary(i)
            if sm.status in DISQUALIFYING or sm.flagged:
                banned.add(sm.candidate_id)
            elif sm.fitness is not None:
                good.setdefault(sm.candidate_id, []).append(i)
        sums = pop.sums  # every index in good has its summary filled in by the loop above
        rows = [(-(sums[idx[0]].fitness if len(idx) == 1 else statistics.median(sums[i].fitness for i in idx)),  # type: ignore[union-attr,type-var,operator]
                 -len(idx), cid, idx) for cid, idx in good.items() if cid not in banned]
        rows.sort()  # plain tuples: compared in C, no key function per row (ids are unique: idx never compared)
        return [(-r[0], r[2], r[3]) for r in (rows if top is None else rows[:max(top, 0)])]

    def _find(self, candidate_id: str) -> Optional[_Population]:
        for pop in self._all_pops():
            if candidate_id in pop.cands:
                return pop
        return None

    def candidate(self, candidate_id: str) -> Candidate:
        """A candidate by id, from whichever shape's log holds it. KeyError if unknown."""
        pop = self._find(candidate_id)
        if pop is None:
            raise KeyError(candidate_id)
        cand = pop.find(pop.cands[candidate_id])
        if cand is None:
            raise KeyError(f"candidate {candidate_id} does not decode (see the archive's problems)")
        return cand  # type: ignore[return-value]

    def resolve(self, prefix: str) -> str:
        """The full id of the one candidate whose id starts with ``prefix`` (like git)."""
        ids = {cid for pop in self._all_pops() for cid in pop.cands if cid.startswith(prefix)} if prefix else set()
        if prefix in ids or len(ids) == 1:
            return prefix if prefix in ids else ids.pop()
        if not ids:
            raise KeyError(f"unknown candidate id {prefix!r}")
        raise KeyError(f"candidate id prefix {prefix!r} is ambiguous ({len(ids)} candidates)")

    def lineage(self, candidate_id: str) -> LineageNode:
        """The ancestry tree of a candidate (a unique id prefix will do), across all shapes."""
        root = self.resolve(candidate_id)
        pops = self._all_pops()
        # Depth-first, pre-order, with an explicit stack: occurrence i's parents all get larger
        # indices, so the frozen nodes can then be built from the last occurrence backwards.
        occurrences: list[tuple[str, bool, list[int]]] = []
        expanded: set[str] = set()
        stack: list[tuple[str, int]] = [(root, -1)]
        cands: dict[str, Optional[Candidate]] = {}
        while stack:
            cid, child = stack.pop()
            repeated = cid in expanded
            occurrences.append((cid, repeated, []))
            if child >= 0:
                occurrences[child][2].append(len(occurrences) - 1)
            if not repeated:
                expanded.add(cid)
                holder = next((p for p in pops if cid in p.cands), None)
                cand = cands[cid] = holder.find(holder.cands[cid]) if holder else None  # type: ignore[assignment]
                for parent in reversed(cand.parents if cand else ()):
                    stack.append((parent, len(occurrences) - 1))
        nodes: list[Optional[LineageNode]] = [None] * len(occurrences)
        for i in range(len(occurrences) - 1, -1, -1):
            cid, repeated, parents = occurrences[i]
            nodes[i] = LineageNode(cid, cands.get(cid), tuple(p.shape for p in pops if cid in p.cands),
                                   tuple(nodes[j] for j in parents), repeated)  # type: ignore[misc]
        return nodes[0]  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"Archive({self.path!r}, mode={self.mode!r})"
