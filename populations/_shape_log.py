"""One shape's record log as the archive reads it: the log (populations._log), an index of its
frames (candidate id -> frame, evaluation frames and their ranking summaries) and the records
decoded so far.

The index is built from frame *keys*, which the writer fills from the record itself
(checksummed with it): an evaluation's key is its ranking summary (:class:`Summary`), a
candidate's its id and, for a candidate made by a model, its :class:`CandidateInfo`. So counting,
ranking and listing need no decoding; records are decoded only when asked for and cached.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple, Optional, Union

from ._codec import CodecError, decode
from ._log import KIND_CANDIDATE, KIND_EVALUATION, Entry, LogError, RecordLog
from ._records import Candidate, Evaluation, Status
from ._shape import Shape

__all__ = ["ArchiveError", "ArchiveDamagedError", "ArchiveLockedError", "CandidateInfo", "Record", "ShapeLog", "Summary"]

Record = Union[Candidate, Evaluation]
#: Decoded candidates kept per shape; more are re-read from disk when asked for.
CANDIDATE_CACHE = 4096


class ArchiveError(Exception):
    """A directory that is not an archive, or an archive used in a way it cannot be."""


class ArchiveDamagedError(ArchiveError):
    """An archive too damaged to open at all (its manifest unreadable while its logs are there):
    damage, exit status 3, not a path that is no archive."""


class ArchiveLockedError(ArchiveError):
    """Another process holds the archive open for writing. Not corruption: wait, or read."""


class Summary(NamedTuple):
    """What ranking needs of an evaluation. It is the evaluation frame's key (written from the
    record itself, checksummed with it), so counting and ranking 50,000 evaluations decode none."""

    candidate_id: str
    status: Status
    flagged: bool
    fitness: Optional[float]

    @classmethod
    def of(cls, ev: Evaluation) -> "Summary":
        return cls(ev.candidate_id, ev.status, bool(ev.flags), ev.fitness)

    def key(self) -> str:
        fit = "-" if self.fitness is None else repr(self.fitness)
        return f"{self.candidate_id}\t{self.status.value}\t{int(self.flagged)}\t{fit}"

    @classmethod
    def parse(cls, key: str) -> Optional["Summary"]:
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


class ShapeLog:
    """One shape's record log with its index (candidate id -> entry, evaluation entries and their ranking
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
        self.sums: list[Optional[Summary]] = []  # parallel to evals
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
            self.sums.append(Summary.parse(entry.key))
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

    def dangling(self) -> list[str]:
        """Evaluations whose candidate this log does not hold (every log stands alone, so its
        candidate was lost to damage): one sentence, or none."""
        orphans = [i for i in range(len(self.evals)) if self.sums[i] is not None
                   and self.sums[i].candidate_id not in self.cands]  # type: ignore[union-attr]
        if not orphans:
            return []
        ids = {self.sums[i].candidate_id for i in orphans}  # type: ignore[union-attr]
        return [f"{self.log.path}: {len(orphans)} evaluation(s) of {len(ids)} candidate(s) this log no longer holds "
                f"(lost to damage; first at offset {self.evals[orphans[0]].offset})"]

    def summary(self, i: int) -> Summary:
        """Evaluation ``i``'s summary, from its key, or decoded if the key is not one."""
        summary = self.sums[i]
        if summary is None:
            summary = self.sums[i] = Summary.of(self.get(self.evals[i]))  # type: ignore[arg-type]
        return summary

