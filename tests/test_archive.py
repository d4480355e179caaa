"""The archive and its record log: queries, durability, damage, locking, readers, compaction.

Every test works on real files in a temporary directory; the lock and concurrent-reader tests
run a second, real Python process.
"""
from __future__ import annotations

import json
import multiprocessing
import multiprocessing.synchronize
import os
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest

from populations import (Archive, ArchiveError, ArchiveLockedError, Candidate, Evaluation, KernelStats,
                         Launch, LaunchPlan, Shape, Status, TimerResult, decode, encode)
from populations._log import FRAME_MAGIC, HEADER_SIZE, KIND_CANDIDATE, KIND_EVALUATION, RecordLog

ROOT = Path(__file__).resolve().parents[1]
S1 = Shape(128, 256, 64)
S2 = Shape(4096, 4096, 4096, "NN")
PLAN = LaunchPlan(launches=(Launch("k", ("cdiv(N, 128)", "cdiv(M, 128)", 1), (256, 1, 1), ("A", "B", "C", "M", "N", "K")),))


def cand(tag: str, shapes: tuple[Shape, ...] = (S1,), parents: tuple[str, ...] = (), **kw: object) -> Candidate:
    return Candidate(source=f"extern \"C\" __global__ void k() {{ /* {tag} */ }}", plan=PLAN, shapes=shapes,
                     parents=parents, template="sm80_mma", knobs={"BM": 128, "tag": tag}, **kw)  # type: ignore[arg-type]


def ev(c: Candidate, speedup: float | None = 1.0, shape: Shape = S1, status: Status = Status.OK, **kw: object) -> Evaluation:
    timers = {} if speedup is None else {"device": TimerResult(1e-3 / speedup, 0, 0, 1e-3, 0, 0, 20)}
    return Evaluation(c.id, shape, status, timers=timers, kernels=(KernelStats("k", registers=96),), **kw)  # type: ignore[arg-type]


def log_path(root: Path, shape: Shape = S1) -> Path:
    return root / f"{shape.key}.evolog"


def fill(root: Path, n: int) -> list[Candidate]:
    """n candidates with one evaluation each, committed one record pair per commit."""
    cs = [cand(str(i)) for i in range(n)]
    with Archive(root, "w") as a:
        for i, c in enumerate(cs):
            a.record(c, [ev(c, 1.0 + i / 10)], durable=True)
    return cs


# -- queries -------------------------------------------------------------------------------
def test_round_trip_and_queries(tmp_path: Path) -> None:
    a_, b_, c_ = cand("a"), cand("b", (S1, S2)), cand("c")
    with Archive(tmp_path, "w") as w:
        w.add(a_)
        w.add(b_)
        w.add(b_)  # idempotent
        w.add(c_)
        w.add(ev(a_, 1.5))
        w.add(ev(a_, 1.1))
        w.add(ev(a_, 1.3))
        w.add(ev(b_, 1.4))
        w.add(ev(b_, 0.9, shape=S2))
        w.add(ev(c_, 9.0))
        w.add(ev(c_, None, status=Status.INCORRECT))  # disqualifies c at S1
        w.add(ev(b_, None, status=Status.TIMEOUT))    # does not disqualify b
        assert [e.candidate_id for e in w.elites(S1)] == [b_.id, a_.id]  # the writer sees its pending records
    r = Archive(tmp_path)
    assert r.shapes() == sorted([S1, S2])
    assert r.candidates(S1) == [a_, b_, c_] and r.candidates(S2) == [b_]
    assert r.candidate_ids(S1) == [a_.id, b_.id, c_.id]
    assert len(r.evaluations(S1)) == 7 and len(r.evaluations(S1, a_.id)) == 3
    elites = r.elites(S1)
    assert [e.candidate_id for e in elites] == [b_.id, a_.id]
    assert elites[1].fitness == pytest.approx(1.3)  # median of 1.5, 1.1, 1.3
    assert elites[1].latest.speedup == pytest.approx(1.3) and elites[1].candidate == a_
    assert r.elites(S1, top=1)[0].candidate_id == b_.id and r.elites(S1, top=0) == []
    assert r.elites(S2)[0].fitness == pytest.approx(0.9)
    counts = r.status_counts(S1)
    assert counts[Status.OK] == 5 and counts[Status.INCORRECT] == 1 and counts[Status.TIMEOUT] == 1
    assert counts[Status.REJECTED] == 0 and set(counts) == set(Status)
    assert r.candidate(b_.id) == b_
    assert r.elites(Shape(1, 1, 1)) == [] and r.candidates("1x1x1") == []
    with pytest.raises(KeyError):
        r.candidate("nope")


def test_flagged_evaluations_disqualify(tmp_path: Path) -> None:
    x, y = cand("x"), cand("y")
    with Archive(tmp_path, "w") as w:
        w.record(x, [ev(x, 3.0), ev(x, 3.0, flags=("timing-too-fast",))])
        w.record(y, [ev(y, 2.0), ev(y, 5.0, status=Status.FLAGGED)])
        assert w.elites(S1) == []


def test_ties_prefer_more_measurements(tmp_path: Path) -> None:
    x, y = cand("x"), cand("y")
    with Archive(tmp_path, "w") as w:
        w.record(x, [ev(x, 2.0)])
        w.record(y, [ev(y, 2.0), ev(y, 2.0)])
        assert [e.candidate_id for e in w.elites(S1)] == [y.id, x.id]


def test_evaluation_needs_its_candidate(tmp_path: Path) -> None:
    x = cand("x")
    with Archive(tmp_path, "w") as w:
        with pytest.raises(ArchiveError, match="unknown candidate"):
            w.add(ev(x))
        w.add(x)
        w.add(ev(x, 1.2, shape=S2))  # at a shape x does not claim: x is copied to S2's log first
        with pytest.raises(TypeError):
            w.add("not a record")  # type: ignore[arg-type]
    assert Archive(tmp_path).candidates(S2) == [x]


def test_lineage_across_shapes(tmp_path: Path) -> None:
    root = cand("root")
    left = cand("left", parents=(root.id,), operator="mutate", generation=1)
    right = cand("right", (S2,), parents=(root.id,), operator="mutate", generation=1)
    child = cand("child", (S2,), parents=(left.id, right.id, "0" * 20), operator="crossover", generation=2)
    with Archive(tmp_path, "w") as w:
        for c in (root, left, right, child):
            w.add(c)
    r = Archive(tmp_path)
    tree = r.lineage(child.id[:8])
    assert tree.candidate == child and tree.shapes == (S2,)
    assert [p.candidate_id for p in tree.parents] == [left.id, right.id, "0" * 20]
    assert tree.parents[0].shapes == (S1,) and tree.parents[2].candidate is None
    first, second = tree.parents[0].parents[0], tree.parents[1].parents[0]
    assert first.candidate == root and not first.repeated
    assert second.candidate_id == root.id and second.repeated and second.parents == ()
    assert [(d, n.candidate_id) for d, n in tree.walk()][:3] == [(0, child.id), (1, left.id), (2, root.id)]
    with pytest.raises(KeyError, match="unknown"):
        r.lineage("ffffffff")
    with pytest.raises(KeyError):
        r.lineage("")


def test_deep_lineage_needs_no_recursion(tmp_path: Path) -> None:
    with Archive(tmp_path, "w") as w:
        prev: tuple[str, ...] = ()
        for i in range(2500):
            c = cand(str(i), parents=prev, generation=i)
            w.add(c)
            prev = (c.id,)
    depth = max(d for d, _ in Archive(tmp_path).lineage(prev[0]).walk())
    assert depth == 2499


def test_reader_cannot_write_and_closed_writer_refuses(tmp_path: Path) -> None:
    fill(tmp_path, 1)
    with pytest.raises(ArchiveError, match="read-only"):
        Archive(tmp_path).add(cand("z"))
    w = Archive(tmp_path, "w")
    w.close()
    w.close()
    with pytest.raises(ArchiveError, match="closed"):
        w.add(cand("z"))


# -- bad directories -------------------------------------------------------------------------
def test_not_an_archive(tmp_path: Path) -> None:
    with pytest.raises(ArchiveError, match="no such"):
        Archive(tmp_path / "missing")
    with pytest.raises(ArchiveError, match="not an evo archive"):
        Archive(tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(ArchiveError, match="not empty"):
        Archive(tmp_path, "w")
    assert sorted(os.listdir(tmp_path)) == ["notes.txt"]  # nothing written
    with pytest.raises(ArchiveError, match="not a directory"):
        Archive(tmp_path / "notes.txt", "w")
    with pytest.raises(ValueError):
        Archive(tmp_path, "a")


def test_newer_versions_are_refused(tmp_path: Path) -> None:
    fill(tmp_path, 1)
    (tmp_path / "archive.json").write_text(json.dumps({"format": "evo-archive", "version": 99}))
    with pytest.raises(ArchiveError, match="newer"):
        Archive(tmp_path)
    (tmp_path / "archive.json").write_text(json.dumps({"format": "evo-archive", "version": 1}))
    data = bytearray(log_path(tmp_path).read_bytes())
    data[6] = 99  # the log's format version
    log_path(tmp_path).write_bytes(bytes(data))
    # a log this evo cannot read is damage to its shape alone: reported, read as empty, never written
    a = Archive(tmp_path)
    assert a.candidates(S1) == [] and any("newer" in p for p in a.problems())
    with pytest.raises(ArchiveError, match="newer.*move that file away"):
        with Archive(tmp_path, "w") as w:
            w.add(cand("new"))
    log_path(tmp_path).write_bytes(b"garbage!" * 4)
    a = Archive(tmp_path)
    assert a.candidates(S1) == [] and any("not an evo record log" in p for p in a.problems())


# -- damage ------------------------------------------------------------------------------------
def test_torn_tail_is_truncated_at_every_cut(tmp_path: Path) -> None:
    src = tmp_path / "src"
    cs = fill(src, 3)
    whole = log_path(src).read_bytes()
    last = RecordLog(str(log_path(src))).entries[-1]
    assert last.end == len(whole)
    cuts = sorted(set(range(last.offset + 1, len(whole), 7)) | {last.offset + 1, len(whole) - 1})
    for cut in cuts:
        dst = tmp_path / f"cut{cut}"
        dst.mkdir()
        (dst / "archive.json").write_bytes((src / "archive.json").read_bytes())
        log_path(dst).write_bytes(whole[:cut])
        r = Archive(dst)  # a reader ignores the tail, silently (it may still be growing) ...
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(r.evaluations(S1)) == 2
        assert log_path(dst).stat().st_size == cut  # ... and never modifies the file
        with pytest.warns(RuntimeWarning, match="torn tail"):
            w = Archive(dst, "w")
        assert log_path(dst).stat().st_size == last.offset
        w.add(ev(cs[0], 7.0), durable=True)  # appends continue cleanly after the cut
        w.close()
        r = Archive(dst)
        assert [e.speedup for e in r.evaluations(S1)] == pytest.approx([1.0, 1.1, 7.0])
        assert r.candidates(S1) == cs


def test_bad_checksum_at_the_end_is_truncated(tmp_path: Path) -> None:
    fill(tmp_path, 3)
    data = bytearray(log_path(tmp_path).read_bytes())
    data[-5] ^= 0xFF
    log_path(tmp_path).write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning, match="torn tail"):
        w = Archive(tmp_path, "w")
    assert len(w.evaluations(S1)) == 2
    w.close()


@pytest.mark.parametrize("where", ["payload", "length", "magic"])
def test_damage_in_the_middle_is_skipped(tmp_path: Path, where: str) -> None:
    cs = fill(tmp_path, 5)
    entries = RecordLog(str(log_path(tmp_path))).entries
    victim = entries[4]  # candidate 2 (entries alternate candidate, evaluation)
    assert victim.kind == KIND_CANDIDATE and victim.key.split("\t")[0] == cs[2].id
    data = bytearray(log_path(tmp_path).read_bytes())
    pos = {"payload": victim.data_offset + 10, "length": victim.offset + 5, "magic": victim.offset}[where]
    data[pos] ^= 0x5A
    log_path(tmp_path).write_bytes(bytes(data))
    size = len(data)
    for mode in ("r", "w"):
        with pytest.warns(RuntimeWarning, match="damaged bytes"):
            a = Archive(tmp_path, mode)
            ids = a.candidate_ids(S1)
        assert ids == [c.id for i, c in enumerate(cs) if i != 2]
        assert len(a.evaluations(S1)) == 5  # candidate 2's evaluation survives, orphaned
        elites = {e.candidate_id: e for e in a.elites(S1, top=None)}
        assert elites[cs[2].id].candidate is None and elites[cs[3].id].candidate == cs[3]
        a.close()
        assert log_path(tmp_path).stat().st_size == size  # the middle is never cut away
    with pytest.warns(RuntimeWarning, match="damaged bytes"):
        w = Archive(tmp_path, "w")
    w.add(cs[2], durable=True)  # the lost candidate can be written again
    w.compact()  # and compaction drops the damaged bytes for good
    w.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(Archive(tmp_path).candidates(S1)) == 5


def test_commit_failure_forgets_the_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cs = fill(tmp_path, 1)
    w = Archive(tmp_path, "w")
    w.add(ev(cs[0], 2.0))

    def full_disk(fd: int) -> None:  # a double for the one boundary we cannot provoke: a full disk
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError):
        w.commit()
    monkeypatch.undo()
    assert len(w.evaluations(S1)) == 1
    w.add(ev(cs[0], 3.0), durable=True)
    w.close()
    assert [e.speedup for e in Archive(tmp_path).evaluations(S1)] == pytest.approx([1.0, 3.0])


# -- one writer, many readers --------------------------------------------------------------
HOLDER = textwrap.dedent("""
    import sys
    from populations import Archive
    a = Archive(sys.argv[1], "w")
    print("locked", flush=True)
    sys.stdin.readline()
    a.close()
""")


def test_second_writer_is_refused(tmp_path: Path) -> None:
    fill(tmp_path, 1)
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(ArchiveLockedError, match=f"pid {proc.pid}"):
            Archive(tmp_path, "w")
        assert len(Archive(tmp_path).candidates(S1)) == 1  # readers are welcome meanwhile
    finally:
        proc.communicate("\n", timeout=30)
    assert proc.returncode == 0
    Archive(tmp_path, "w").close()  # the lock went with the process


def test_second_writer_in_this_process_is_refused(tmp_path: Path) -> None:
    with Archive(tmp_path, "w"):
        with pytest.raises(ArchiveLockedError):
            Archive(tmp_path, "w")


WRITER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from test_archive import cand, ev
    from populations import Archive
    with Archive(sys.argv[1], "w") as a:
        for i in range(int(sys.argv[3])):
            c = cand(f"w{i}")
            a.record(c, [ev(c, 1.0)])
            if i % 3 == 0:
                a.commit()
""")


def test_reader_during_writes(tmp_path: Path) -> None:
    n = 600
    Archive(tmp_path, "w").close()
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(ROOT / "tests"), str(n)], cwd=ROOT)
    seen: list[int] = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a growing file is never "damage"
        r = Archive(tmp_path)
        while True:
            done = proc.poll() is not None
            r.refresh()
            ids = r.candidate_ids(S1)
            evals = r.evaluations(S1)
            assert len(evals) <= len(ids) and len(ids) <= len(evals) + 1
            assert [e.candidate_id for e in evals] == ids[:len(evals)]
            seen.append(len(ids))
            if done:
                break
            time.sleep(0.005)
    assert proc.returncode == 0
    assert seen == sorted(seen) and seen[-1] == n
    assert len(set(seen)) > 2, "the reader never saw the file grow; the test proved nothing"


# -- compaction ------------------------------------------------------------------------------
def test_compaction(tmp_path: Path) -> None:
    x, y = cand("x"), cand("y")
    ex = ev(x, 2.0)
    with Archive(tmp_path, "w") as w:
        w.record(x, [ex, ex, ev(x, 2.2)])  # the same evaluation twice: a duplicate
        w.record(y, [ev(y, 1.0)])
        w._shape_log(S1).log.append(KIND_CANDIDATE, x.id, encode(x))  # type: ignore[union-attr]  # a duplicate the API never writes
    reader = Archive(tmp_path)
    assert len(reader.evaluations(S1)) == 4
    with Archive(tmp_path, "w") as w:
        before, after = w.compact()[S1]
        assert after < before
        assert len(w.evaluations(S1)) == 3 and w.candidates(S1) == [x, y]
        w.compact(S1, keep=lambda rec: not (isinstance(rec, Evaluation) and rec.candidate_id == y.id))
        assert [e.candidate_id for e in w.evaluations(S1)] == [x.id, x.id]
        w.add(ev(y, 1.5))
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp")]
    assert len(reader.evaluations(S1)) == 4  # an open reader keeps its (old) file ...
    reader.refresh()  # ... until it looks again
    assert [e.speedup for e in reader.evaluations(S1)] == pytest.approx([2.0, 2.2, 1.5])
    assert reader.candidates(S1) == [x, y]


def test_leftover_temporary_files_are_removed(tmp_path: Path) -> None:
    fill(tmp_path, 1)
    tmp = tmp_path / f"{S1.key}.evolog.tmp"
    tmp.write_bytes(b"half a compaction")
    Archive(tmp_path).close()
    assert tmp.exists()  # readers never touch anything
    Archive(tmp_path, "w").close()
    assert not tmp.exists()


def test_frames_decode_as_codec_records(tmp_path: Path) -> None:
    cs = fill(tmp_path, 2)
    log = RecordLog(str(log_path(tmp_path)))
    raw = log_path(tmp_path).read_bytes()
    assert raw[:6] == b"EVOLOG" and raw[HEADER_SIZE:HEADER_SIZE + 4] == FRAME_MAGIC
    assert decode(log.read(log.entries[0])) == cs[0]


def test_candidate_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import populations._shape_log as archive_module
    monkeypatch.setattr(archive_module, "CANDIDATE_CACHE", 4)
    cs = [cand(str(i)) for i in range(10)]
    with Archive(tmp_path, "w") as w:
        for c in cs:
            w.add(c)
        assert w.candidates(S1) == cs  # uncommitted: all held, none evictable
        w.commit()
        pop = w._shape_log(S1)
        assert pop is not None and len(pop.recent) == 4 and not pop.objects
        assert w.candidates(S1) == cs and len(pop.recent) == 4  # re-read from disk as needed


def _sleep_forever(started: "multiprocessing.synchronize.Event") -> None:
    started.set()  # the at-fork hooks have run by now
    time.sleep(60)


def test_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    w = Archive(tmp_path, "w")
    started = ctx.Event()
    child = ctx.Process(target=_sleep_forever, args=(started,))
    child.start()
    try:
        assert started.wait(30)
        w.close()
        Archive(tmp_path, "w").close()  # the child's inherited descriptor does not hold the lock
    finally:
        child.kill()
        child.join()


def test_ranking_decodes_only_the_rows_returned(tmp_path: Path) -> None:
    cs = fill(tmp_path, 30)
    r = Archive(tmp_path)
    assert r.status_counts(S1)[Status.OK] == 30
    top = r.elites(S1, top=2)
    assert [e.candidate_id for e in top] == [cs[29].id, cs[28].id]
    pop = r._shape_log(S1)
    assert pop is not None and len(pop.objects) == 2 and len(pop.recent) == 2  # two evaluations, two candidates


def test_evaluations_without_a_summary_key_are_decoded(tmp_path: Path) -> None:
    x = cand("x")
    with Archive(tmp_path, "w") as w:
        w.add(x)
        w.commit()
        pop = w._shape_log(S1)
        assert pop is not None
        for e in (ev(x, 2.0), ev(x, 3.0), ev(x, None, status=Status.RUNTIME_ERROR)):  # as a plain-id key would be
            pop.log.append(KIND_EVALUATION, x.id, encode(e))
    r = Archive(tmp_path)
    assert r.elites(S1)[0].fitness == pytest.approx(2.5) and r.status_counts(S1)[Status.RUNTIME_ERROR] == 1
    assert len(r.evaluations(S1, x.id)) == 3
