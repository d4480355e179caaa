"""The side index of a record log (populations/_index.py): used when the log is unchanged, ignored
otherwise, and never a way for damage to go unseen."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import populations._log as log_mod
from populations import Archive, Candidate, Evaluation, Launch, LaunchPlan, Shape, Status, TimerResult
from populations._index import INDEX_SUFFIX

S = Shape(128, 256, 64)
PLAN = LaunchPlan(launches=(Launch("k", ("cdiv(N, 128)", "cdiv(M, 128)", 1), (256, 1, 1), ("A", "B", "C", "M", "N", "K")),))


def fill(root: Path, n: int, first: int = 0) -> list[Candidate]:
    cs = [Candidate(source=f"__global__ void k() {{ /* {i} */ }}", plan=PLAN, shapes=(S,)) for i in range(first, first + n)]
    with Archive(root, "w") as a:
        for i, c in enumerate(cs):
            t = 1e-3 / (1 + i / 100)
            a.record(c, [Evaluation(c.id, S, Status.OK, timers={"device": TimerResult(t, t, t, 1e-3, 1e-3, 1e-3, 9)})])
    return cs


def scanned(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Bytes each _scan call covered."""
    sizes: list[int] = []
    real = log_mod._scan

    def spy(fd: int, start: int, limit: int) -> log_mod._Scan:
        sizes.append(limit - start)
        return real(fd, start, limit)

    monkeypatch.setattr(log_mod, "_scan", spy)
    return sizes


def test_an_unchanged_log_opens_without_a_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cs = fill(tmp_path / "a", 50)
    log = tmp_path / "a" / f"{S.key}.evolog"
    assert Path(f"{log}{INDEX_SUFFIX}").exists()
    sizes = scanned(monkeypatch)
    with Archive(tmp_path / "a") as a:
        assert a.candidate_ids(S) == [c.id for c in cs] and a.elites(S, top=1)[0].candidate_id == cs[-1].id
        assert a.problems() == []
    assert sizes == [0]  # nothing after the indexed length


def test_a_changed_log_is_scanned_in_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fill(tmp_path / "a", 20)
    log = tmp_path / "a" / f"{S.key}.evolog"
    size = log.stat().st_size
    data = bytearray(log.read_bytes())
    data[size // 2] ^= 0xFF  # damage in the middle: the file's mtime changes, the index no longer applies
    log.write_bytes(bytes(data))
    sizes = scanned(monkeypatch)
    with Archive(tmp_path / "a") as a:
        assert any("damaged bytes" in p for p in a.problems())
    assert sizes[0] == size - 8


def test_damage_behind_an_index_is_caught_on_read(tmp_path: Path) -> None:
    """A flip that even keeps the mtime (bit rot) is not seen at open, but the record it hits
    fails its checksum when read and is reported alone."""
    cs = fill(tmp_path / "a", 20)
    log = tmp_path / "a" / f"{S.key}.evolog"
    st = log.stat()
    with Archive(tmp_path / "a") as a:
        victim = a._shape_log(S).cands[cs[0].id]  # type: ignore[union-attr]  # far from the checksummed tail
    with open(log, "r+b") as fh:
        fh.seek(victim.data_offset + 5)
        byte = fh.read(1)
        fh.seek(victim.data_offset + 5)
        fh.write(bytes([byte[0] ^ 0xFF]))
    os.utime(log, ns=(st.st_atime_ns, st.st_mtime_ns))
    with Archive(tmp_path / "a") as a:
        assert a.problems() == []  # not seen at open: the index was used
        assert len(a.candidates(S)) == 19 and [p for p in a.problems() if "checksum mismatch" in p]
        assert a.lineage(cs[0].id).candidate is None and a.elites(S, top=1)[0].candidate_id == cs[-1].id


def test_appends_and_compaction_keep_the_index_right(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = fill(tmp_path / "a", 10)
    more = fill(tmp_path / "a", 5, first=100)
    with Archive(tmp_path / "a") as a:
        assert a.candidate_ids(S) == [c.id for c in first + more]
    with Archive(tmp_path / "a", "w") as w:
        w.compact()
    sizes = scanned(monkeypatch)
    with Archive(tmp_path / "a") as a:
        assert a.candidate_ids(S) == [c.id for c in first + more] and a.problems() == []
    assert sizes == [0]  # the writer that compacted indexed the new file when it closed
