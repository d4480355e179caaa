"""The archive: every candidate and evaluation evo made, one crash-safe record log per shape.

Directory layout::

    DIR/archive.json            {"format": "evo-archive", "version": 1}: marks the directory
    DIR/.lock                   flock()ed by the one writer (holds its pid, for the error message)
    DIR/<Shape.key>.evolog      one shape's record log (see populations._log for the format)

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

import hashlib
import json
import os
from collections import Counter
from typing import Callable, Iterable, Iterator, Optional, Union

from ._codec import encode
from ._index import INDEX_SUFFIX, orphans
from ._lineage import LineageNode, build_lineage
from ._lock import WriterLock, why, writer_active
from ._log import KIND_CANDIDATE, KIND_EVALUATION, LogError, RecordLog, atomic_write, rewrite
from ._ranking import Elite, rank
from ._records import Candidate, Evaluation, Status
from ._shape import Shape, ShapeError
from ._shape_log import ArchiveDamagedError, ArchiveError, ArchiveLockedError, CandidateInfo, Record, ShapeLog, Summary

__all__ = ["Archive", "ArchiveDamagedError", "ArchiveError", "ArchiveLockedError", "CandidateInfo", "Elite", "LineageNode"]

FORMAT = "evo-archive"
VERSION = 1
MANIFEST = "archive.json"
LOCK = ".lock"
SUFFIX = ".evolog"
ShapeLike = Union[Shape, str]


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

    def __init__(self, path: Union[str, os.PathLike], mode: str = "r", *, verify: bool = False) -> None:
        if mode not in ("r", "w"):
            raise ValueError(f"mode must be 'r' or 'w', got {mode!r}")
        self.path, self.mode = os.path.abspath(os.fspath(path)), mode
        #: checksum every frame of every log at open, the side index only compared against (what
        #: commands that publish or resume from an archive need: damage must not go unseen)
        self.verify = verify
        self._shape_logs: dict[Shape, ShapeLog] = {}
        self._bad: dict[Shape, str] = {}      # shape logs that cannot be opened, and why
        self._problems: list[str] = []        # records that do not decode
        self._writer_lock: Optional[WriterLock] = None
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
            raise self._manifest_error(f"not an evo archive (no {MANIFEST})") from None
        except (OSError, ValueError) as exc:  # ValueError: bad JSON or not UTF-8
            raise self._manifest_error(f"unreadable {MANIFEST}: {why(exc)}") from None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise self._manifest_error(f"{MANIFEST} does not describe an evo archive")
        version = manifest.get("version")
        if not isinstance(version, int) or version > VERSION:
            raise ArchiveError(f"{self.path}: archive version {version!r} is newer than this evo (v{VERSION})")

    def _manifest_error(self, what: str) -> ArchiveError:
        """A bad manifest beside record logs is damage to an archive; without logs, no archive."""
        if any(name.endswith(SUFFIX) for name in os.listdir(self.path)):
            return ArchiveDamagedError(f"{self.path}: damaged archive: {what} (the record logs are there: "
                                       f"restore {MANIFEST} as {{\"format\": \"{FORMAT}\", \"version\": {VERSION}}})")
        return ArchiveError(f"{self.path}: {what}")

    def _open_writer(self) -> None:
        try:
            self._create_dir()
        except OSError as exc:  # under a regular file, under /proc, read-only, no space: say which
            raise ArchiveError(f"{self.path}: cannot create or write the archive here: {why(exc)}") from None

    def _create_dir(self) -> None:
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise ArchiveError(f"{self.path}: not a directory")
        os.makedirs(self.path, exist_ok=True)
        fresh = not os.path.exists(os.path.join(self.path, MANIFEST))
        if fresh and set(os.listdir(self.path)) - {LOCK, MANIFEST + ".tmp"}:
            raise self._manifest_error("not an evo archive and not empty; refusing to write there")
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
                self._shape_log(shape)
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        def locked(holder: str) -> ArchiveLockedError:
            return ArchiveLockedError(
                f"{self.path} is being written by {holder}; one writer at a time: wait for it to "
                "finish or stop it (Ctrl-C lets it commit), or read the archive meanwhile "
                "(evo inspect needs no lock)")

        self._writer_lock = WriterLock(os.path.join(self.path, LOCK), locked)

    def _shape_log(self, shape: Shape, create: bool = False) -> Optional[ShapeLog]:
        """A shape's log, opened on first use. A log that cannot be opened (empty, stray,
        not a log, unreadable) is damage to that shape alone: it is remembered in
        :meth:`problems` and the shape reads as empty; only writing to it is refused."""
        shape_log = self._shape_logs.get(shape)
        if shape_log is None:
            if shape in self._bad:
                if create:
                    raise ArchiveError(f"{self._bad[shape]}; cannot add to shape {shape}: move that file away "
                                       "to start the shape afresh")
                return None
            path = os.path.join(self.path, shape.key + SUFFIX)
            if not os.path.exists(path) and not (create and self.mode == "w"):
                return None
            try:
                log = RecordLog(path, writable=self.mode == "w", verify=self.verify)
            except OSError as exc:  # LogError, or the OS refusing to open or read it
                self._bad[shape] = str(exc) if isinstance(exc, LogError) else f"{path}: {why(exc)}"
                return self._shape_log(shape, create)
            shape_log = self._shape_logs[shape] = ShapeLog(shape, log, self._problems)
        return shape_log

    def problems(self, *, all_shapes: bool = True) -> list[str]:
        """Every piece of damage seen, one sentence each naming the file: shape logs that could
        not be opened, damaged regions skipped, torn tails (cut by a writer, kept in a side
        file, or pending for a reader: not while a writer holds the lock, whose tail is a write in
        progress), records that did not decode. With ``all_shapes`` every shape's log is opened
        first, so the list is complete."""
        if all_shapes:
            self._all_shape_logs()
        out = list(self._bad.values()) + (orphans(self.path, SUFFIX) if all_shapes else [])
        live = self.mode == "r" and writer_active(os.path.join(self.path, LOCK))
        for shape_log in self._shape_logs.values():  # a live writer's tail is a write in progress, not damage
            out += shape_log.log.problems(tail=not live) + shape_log.dangling()
        return out + self._problems

    def _all_shape_logs(self) -> list[ShapeLog]:
        return [p for p in (self._shape_log(s) for s in self.shapes()) if p is not None]

    def refresh(self) -> None:
        """Reader: pick up records (and shapes) a concurrent writer committed since open."""
        for shape_log in self._shape_logs.values():
            shape_log.log.refresh()
            shape_log.sync()

    def _locked(self) -> bool:
        """This process holds the writer lock (not in a child forked while it did)."""
        return self._writer_lock is not None and self._writer_lock.held

    # -- writing ----------------------------------------------------------------------------
    def _writer(self) -> None:
        if self.mode != "w":
            raise ArchiveError(f"{self.path}: opened read-only")
        if not self._locked():
            raise ArchiveError(f"{self.path}: archive is closed")

    def add(self, record: Record, *, durable: bool = False) -> None:
        """Append a candidate (to every shape it claims) or an evaluation (to its shape).

        Idempotent for candidates: one already in a shape's log is not written again. An
        evaluation needs its candidate in this archive (add the candidate first)."""
        self._writer()
        if isinstance(record, Candidate):
            payload = None
            for shape in record.shapes:
                shape_log = self._shape_log(shape, create=True)
                assert shape_log is not None
                if record.id not in shape_log.cands:
                    payload = payload or encode(record)
                    key = shape_log.candidate_key(record)
                    shape_log.index(shape_log.log.append(KIND_CANDIDATE, key, payload), record)
        elif isinstance(record, Evaluation):
            shape_log = self._shape_log(record.shape, create=True)
            assert shape_log is not None
            if record.candidate_id not in shape_log.cands:
                owner = self._find(record.candidate_id)
                if owner is None:
                    raise ArchiveError(f"evaluation of unknown candidate {record.candidate_id}: add the candidate first")
                cand = owner.get(owner.cands[record.candidate_id])
                key = shape_log.candidate_key(cand)  # type: ignore[arg-type]
                shape_log.index(shape_log.log.append(KIND_CANDIDATE, key, encode(cand)), cand)
            shape_log.index(shape_log.log.append(KIND_EVALUATION, Summary.of(record).key(), encode(record)), record)
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
        for shape_log in self._shape_logs.values():
            if shape_log.log.pending:
                try:
                    shape_log.log.commit()
                except OSError:
                    shape_log.rebuild()  # forget the records that did not make it
                    raise
                shape_log.committed()

    def compact(self, shape: Optional[ShapeLike] = None, *,
                keep: Optional[Callable[[Record], bool]] = None) -> dict[Shape, tuple[int, int]]:
        """Rewrite logs without duplicate candidates, byte-identical duplicate evaluations,
        damaged regions, and records for which ``keep(record)`` is False (e.g. superseded ones).

        Each log is rewritten to a new file and renamed over the old one atomically (readers
        holding the old file keep reading it; :meth:`refresh` moves them to the new one).
        Returns {shape: (bytes before, bytes after)}."""
        self._writer()
        self.commit()
        one = None if shape is None else self._shape_log(_as_shape(shape))
        shape_logs = self._all_shape_logs() if shape is None else [one] if one is not None else []
        sizes = {}
        for shape_log in shape_logs:
            before = os.path.getsize(shape_log.log.path)
            if os.path.exists(shape_log.log.path + INDEX_SUFFIX):  # it describes the old file: gone first,
                os.unlink(shape_log.log.path + INDEX_SUFFIX)       # or a crash would make it say records were lost
            rewrite(shape_log.log.path, self._kept_frames(shape_log, keep))
            shape_log.log.close()
            shape_log.log = RecordLog(shape_log.log.path, writable=True)
            shape_log.rebuild()
            sizes[shape_log.shape] = (before, os.path.getsize(shape_log.log.path))
        return sizes

    @staticmethod
    def _kept_frames(shape_log: ShapeLog, keep: Optional[Callable[[Record], bool]]) -> Iterator[bytes]:
        seen_ids: set[str] = set()
        seen_evals: set[bytes] = set()
        for entry in shape_log.log.entries:
            raw = shape_log.log.raw(entry)
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
            record = shape_log.find(entry)
            if record is None or keep(record):  # an undecodable record is kept for a closer look
                yield raw

    def close(self) -> None:
        """Commit (writer), close every log and release the lock. Safe to call twice."""
        try:
            if self.mode == "w" and self._locked():
                self.commit()
                for shape_log in self._shape_logs.values():
                    try:
                        shape_log.log.save_index()
                    except OSError:  # the index is a cache: without it the next open scans
                        pass
        finally:
            for shape_log in self._shape_logs.values():
                shape_log.log.close()
            self._shape_logs.clear()
            if self._writer_lock is not None:
                self._writer_lock.release()

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queries ----------------------------------------------------------------------------
    def shapes(self) -> list[Shape]:
        """Shapes with a log in this archive, sorted."""
        found = {s for s in map(_shape_of_file, os.listdir(self.path)) if s is not None}
        return sorted(found | set(self._shape_logs))

    def candidate_ids(self, shape: ShapeLike) -> list[str]:
        """Ids of the candidates at a shape, in archive order (no decoding)."""
        shape_log = self._shape_log(_as_shape(shape))
        return list(shape_log.cands) if shape_log else []

    def candidates(self, shape: ShapeLike) -> list[Candidate]:
        """Every candidate claiming a shape (decoded; one that does not decode is
        skipped and reported in :meth:`problems`)."""
        shape_log = self._shape_log(_as_shape(shape))
        return [c for c in map(shape_log.find, shape_log.cands.values()) if c is not None] if shape_log else []  # type: ignore[misc]

    def model_candidates(self, shape: ShapeLike) -> list[CandidateInfo]:
        """The candidates of a shape made by a model (an LLM), as :class:`CandidateInfo`, in
        archive order. Read from the frame keys: no candidate is decoded (except those of
        archives written before the keys carried it)."""
        shape_log = self._shape_log(_as_shape(shape))
        return [i for i in map(shape_log.model_info, shape_log.cands) if i is not None] if shape_log else []

    def evaluations_of(self, shape: ShapeLike, candidate_ids: Iterable[str]) -> dict[str, list[Evaluation]]:
        """{candidate id: its evaluations at the shape, in archive order} for the given ids,
        chosen on the ranking summaries: only those evaluations are decoded."""
        shape_log = self._shape_log(_as_shape(shape))
        wanted = set(candidate_ids)
        out: dict[str, list[Evaluation]] = {}
        for i in range(len(shape_log.evals) if shape_log else 0):
            cid = shape_log.summary(i).candidate_id  # type: ignore[union-attr]
            if cid in wanted:
                ev = shape_log.find(shape_log.evals[i])  # type: ignore[union-attr]
                if ev is not None:
                    out.setdefault(cid, []).append(ev)  # type: ignore[arg-type]
        return out

    def evaluations(self, shape: ShapeLike, candidate_id: Optional[str] = None) -> list[Evaluation]:
        """Evaluations at a shape in archive order, optionally of one candidate only."""
        shape_log = self._shape_log(_as_shape(shape))
        if shape_log is None:
            return []
        found = map(shape_log.find, shape_log.evals if candidate_id is None else
                    [shape_log.evals[i] for i in range(len(shape_log.evals)) if shape_log.summary(i).candidate_id == candidate_id])
        return [e for e in found if e is not None]  # type: ignore[misc]

    def status_counts(self, shape: ShapeLike) -> dict[Status, int]:
        """How many evaluations at a shape ended in each status (every status listed)."""
        counts = dict.fromkeys(Status, 0)
        shape_log = self._shape_log(_as_shape(shape))
        if shape_log is not None:
            counts.update(Counter(shape_log.summary(i).status for i in range(len(shape_log.evals))))
        return counts

    def elites(self, shape: ShapeLike, top: Optional[int] = 10) -> list[Elite]:
        """The best ``top`` candidates at a shape, one row each, by evo's one elite ranking
        (:mod:`populations._ranking`: the median over ok, unflagged measurements)."""
        shape_log = self._shape_log(_as_shape(shape))
        if shape_log is None:
            return []
        ranked = self._ranked(shape_log, top)
        out = []
        for fit, cid, idx in ranked:  # a record that does not decode drops out of its row, not the table
            evals = tuple(e for e in (shape_log.find(shape_log.evals[i]) for i in idx) if e is not None)
            if evals:
                out.append(Elite(cid, fit, evals,  # type: ignore[arg-type]
                                 shape_log.find(shape_log.cands[cid]) if cid in shape_log.cands else None))  # type: ignore[arg-type]
        return out

    def fitness(self, shape: ShapeLike) -> dict[str, float]:
        """{candidate id: its elite fitness} for every candidate ranked at the shape (the
        fitness of :meth:`elites`, best first), from the summaries: nothing is decoded."""
        shape_log = self._shape_log(_as_shape(shape))
        return {cid: fit for fit, cid, _idx in self._ranked(shape_log)} if shape_log else {}

    @staticmethod
    def _ranked(shape_log: ShapeLog, top: Optional[int] = None) -> list[tuple[float, str, list[int]]]:
        """(fitness, id, evaluation indexes) of every elite, best first (:func:`populations.rank`
        on the frame keys' summaries: nothing is decoded)."""
        return rank((shape_log.summary(i) for i in range(len(shape_log.evals))), top)

    def _find(self, candidate_id: str) -> Optional[ShapeLog]:
        for shape_log in self._all_shape_logs():
            if candidate_id in shape_log.cands:
                return shape_log
        return None

    def candidate(self, candidate_id: str) -> Candidate:
        """A candidate by id, from whichever shape's log holds it. KeyError if unknown."""
        shape_log = self._find(candidate_id)
        if shape_log is None:
            raise KeyError(candidate_id)
        cand = shape_log.find(shape_log.cands[candidate_id])
        if cand is None:
            raise KeyError(f"candidate {candidate_id} does not decode (see the archive's problems)")
        return cand  # type: ignore[return-value]

    def resolve(self, prefix: str) -> str:
        """The full id of the one candidate whose id starts with ``prefix`` (like git)."""
        ids = {cid for log in self._all_shape_logs() for cid in log.cands if cid.startswith(prefix)} if prefix else set()
        if prefix in ids or len(ids) == 1:
            return prefix if prefix in ids else ids.pop()
        if not ids:
            raise KeyError(f"unknown candidate id {prefix!r}")
        raise KeyError(f"candidate id prefix {prefix!r} is ambiguous ({len(ids)} candidates)")

    def lineage(self, candidate_id: str, *, missing_ok: bool = False) -> LineageNode:
        """The ancestry tree of a candidate (a unique id prefix will do), across all shapes. With
        ``missing_ok`` an id no log holds (a candidate lost to damage, whose evaluations survived)
        is a tree of one node without a candidate instead of a KeyError."""
        try:
            full = self.resolve(candidate_id)
        except KeyError:
            if not missing_ok:
                raise
            full = candidate_id
        return build_lineage(full, self._all_shape_logs())

    def __repr__(self) -> str:
        return f"Archive({self.path!r}, mode={self.mode!r})"
