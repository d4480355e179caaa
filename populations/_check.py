"""Checking an archive end to end, and repairing it into a clean copy (``evo archive check``).

:func:`check_archive` opens every shape log with every frame checksummed (the side index only
compared against: records it lists that are gone are damage), decodes every record and looks
for references the damage left dangling (an evaluation whose candidate is lost). It lists the
damage, one sentence each naming the file, offset, bytes and records lost; an empty list is an
archive that is whole.

:func:`repair_archive` writes a new archive beside the damaged one (never touching it) holding
every record that survived: candidates first where an evaluation needs one the damage moved
away, evaluations whose candidate is lost everywhere left out and counted. It is written to
``<out>.partial`` and renamed into place when whole, so a killed repair never leaves a copy that
looks finished. The copy is a normal archive; the damaged original stays for a closer look.
"""
from __future__ import annotations

import os
import shutil
import warnings
from dataclasses import dataclass, field
from typing import Union

from ._archive import LOCK, MANIFEST, SUFFIX, Archive, ArchiveError
from ._index import INDEX_SUFFIX
from ._records import Candidate, Evaluation

__all__ = ["CheckResult", "RepairResult", "check_archive", "repair_archive"]


@dataclass
class CheckResult:
    """What :func:`check_archive` found: the damage (empty: whole) and what was read."""

    path: str
    damage: list[str] = field(default_factory=list)
    shapes: int = 0
    candidates: int = 0
    evaluations: int = 0

    @property
    def ok(self) -> bool:
        return not self.damage


@dataclass
class RepairResult:
    """What :func:`repair_archive` wrote, and what it had to leave out."""

    source: str
    out: str
    candidates: int = 0
    evaluations: int = 0
    dropped: list[str] = field(default_factory=list)


def check_archive(path: Union[str, os.PathLike]) -> CheckResult:
    """Verify every frame and decode every record of the archive at ``path`` (read-only, no lock).
    ArchiveError when ``path`` is not an archive at all."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the damage is returned, not warned
        archive = Archive(path, "r", verify=True)
        try:
            out = CheckResult(archive.path, shapes=len(archive.shapes()))
            for shape in archive.shapes():
                out.candidates += len(archive.candidates(shape))    # decodes each: failures land in problems
                out.evaluations += len(archive.evaluations(shape))
            out.damage = archive.problems()
        finally:
            archive.close()
    return out


def repair_archive(path: Union[str, os.PathLike], out: Union[str, os.PathLike, None] = None) -> RepairResult:
    """Copy every intact record of the archive at ``path`` into a new archive ``out`` (default
    ``<path>.repaired``, beside it; it must not exist). The source is only read."""
    src_path = os.path.abspath(os.fspath(path))
    dest = os.path.abspath(os.fspath(out)) if out is not None else src_path.rstrip(os.sep) + ".repaired"
    if os.path.lexists(dest):
        raise ArchiveError(f"{dest} exists; the repaired copy goes to a new directory (name another with --out)")
    staging = dest + ".partial"  # a repair killed half-way leaves this, never a plausible-looking copy
    shutil.rmtree(staging, ignore_errors=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        src = Archive(src_path, "r", verify=True)
        try:
            result = RepairResult(src.path, dest)
            with Archive(staging, "w") as dst:
                _copy(src, dst, result)
            _copy_side_files(src.path, staging)
            os.rename(staging, dest)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)  # nothing half-written is left behind
            raise
        finally:
            src.close()
    return result


def _copy(src: Archive, dst: Archive, result: RepairResult) -> None:
    """Every decodable record of ``src``, shape by shape, in log order."""
    written: set[str] = set()
    for shape in src.shapes():
        shape_log = src._shape_log(shape)
        if shape_log is None:
            continue
        for entry in shape_log.log.entries:
            record = shape_log.find(entry)
            if record is None:
                continue  # reported by check: it does not decode
            if isinstance(record, Candidate):
                result.candidates += record.id not in written
                written.add(record.id)
                dst.add(record)
            elif isinstance(record, Evaluation):
                if record.candidate_id not in written:
                    try:
                        cand = src.candidate(record.candidate_id)
                    except KeyError:
                        result.dropped.append(f"{shape_log.log.path}: evaluation at offset {entry.offset}: its "
                                              f"candidate {record.candidate_id} is lost")
                        continue
                    written.add(cand.id)
                    result.candidates += 1
                    dst.add(cand)
                dst.add(record)
                result.evaluations += 1
    dst.commit()


def _copy_side_files(src: str, dest: str) -> None:
    """The archive's other files (the calibration, notes): not logs, indexes, locks or leftovers."""
    for name in os.listdir(src):
        full = os.path.join(src, name)
        if (name in (LOCK, MANIFEST) or name.endswith((SUFFIX, SUFFIX + INDEX_SUFFIX, ".torn", ".tmp"))
                or ".evolog." in name or not os.path.isfile(full)):
            continue
        shutil.copy2(full, os.path.join(dest, name))
