"""Kill -9 a writer at random points, over and over; nothing committed may ever be lost.

Each writer is a real process (forked from this one, so it starts in milliseconds) that resumes
the archive, appends batches of candidates and evaluations to two shapes, commits, and only
*after* ``commit()`` returns appends the last committed sequence number to a side file and
fsyncs it. The parent SIGKILLs it at a random moment (during recovery, encoding, the write, the
fsync, anywhere), reopens the archive as the next writer would, and checks that every number
the side file promises is there, that nothing raises, and that every record still decodes.
Several archives run side by side, so kills overlap with other writers' I/O.
"""
from __future__ import annotations

import multiprocessing
import os
import random
import re
import signal
import time
import warnings
from pathlib import Path
from typing import Optional

import pytest

from populations import Archive, Candidate, Evaluation, Launch, LaunchPlan, Shape, Status, TimerResult

SHAPES = (Shape(64, 64, 64), Shape(256, 128, 512, "NN"))
PLAN = LaunchPlan(launches=(Launch("k", ("cdiv(N, 64)", "cdiv(M, 64)", 1), (128, 1, 1), ("A", "B", "C", "M", "N", "K")),))
BATCHES = (1, 1, 2, 3, 8, 17, 64)


def make(seq: int) -> tuple[Candidate, Evaluation]:
    """Record pair number ``seq``: a candidate of varied size (so writes vary) and its evaluation."""
    filler = "// padding\n" * (seq * 7919 % 600)
    c = Candidate(source=f'extern "C" __global__ void k() {{}}\n// seq {seq}\n{filler}', plan=PLAN,
                  shapes=(SHAPES[seq % 2],), meta={"seq": seq})
    timer = TimerResult(1e-3, 1e-3, 1e-3, 1.1e-3, 1.1e-3, 1.1e-3, 10)
    return c, Evaluation(c.id, c.shapes[0], Status.OK, message=str(seq), timers={"device": timer})


#: one promise: ``seq:id`` with a whole candidate id (a torn token is shorter, or has no colon)
PROMISE = re.compile(r"^(\d+):([0-9a-f]{20})$")


def committed(side: Path) -> list[tuple[int, str]]:
    """Every (sequence number, candidate id) a writer promised; a line is ``seq:id seq:id ...``,
    one per commit. A writer killed in the middle of a line leaves it torn (SIGKILL can cut a
    write short); the next writer starts on a new line, so a torn line ends there and only its
    last token can be cut: whole tokens count (their commits had returned), cut ones do not."""
    text = side.read_bytes().decode() if side.exists() else ""
    return [(int(m[1]), m[2]) for line in text.split("\n")[:-1] for p in line.split() if (m := PROMISE.match(p))]


def writer(root: str, side: str, seed: int) -> None:
    """Child process body: resume after the newest record on disk, then append and commit
    forever, recording each commit in the side file after it returns."""
    rng, parent = random.Random(seed), os.getppid()
    fd = os.open(side, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, b"\n")  # ends a line the writer before this one was killed in the middle of
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torn-tail notices during recovery are expected
        archive = Archive(root, "w")
    newest = [archive.candidate(ids[-1]).meta["seq"] for ids in map(archive.candidate_ids, SHAPES) if ids]
    seq = max(newest, default=-1) + 1
    commits = rng.randint(1, 30)  # bounded, so a late kill (a busy parent) cannot grow the archive without end
    while os.getppid() == parent:  # never outlive the test (if it dies, we are reparented)
        if commits == 0:
            time.sleep(0.005)  # done writing; wait for the kill
            continue
        commits -= 1
        batch = []
        for _ in range(rng.choice(BATCHES)):
            candidate, evaluation = make(seq)
            archive.record(candidate, [evaluation])
            batch.append(f"{seq}:{candidate.id}")
            seq += 1
        archive.commit()
        os.write(fd, (" ".join(batch) + "\n").encode())
        os.fsync(fd)


class Lane:
    """A run of archives, each resumed by ``restarts`` writers in turn; the current writer; and
    how much of the current archive's promises the parent has checked."""

    def __init__(self, root: Path, seed: int, restarts: int) -> None:
        self.base, self.restarts, self.rng = root, restarts, random.Random(seed)
        self.number, self.kills, self.torn = 0, 0, 0
        self.proc: Optional[multiprocessing.process.BaseProcess] = None
        self.kill_at = 0.0
        self.new_archive()

    def new_archive(self) -> None:
        self.root = self.base / str(self.number)
        self.side = self.root.with_suffix(".side")
        self.number += 1
        self.verified = 0  # how many promises of this archive were checked present
        self.base.mkdir(exist_ok=True)
        Archive(self.root, "w").close()

    def verify(self) -> None:
        """Reopen and check that every promised record is there. A reader does it (a writer
        would queue behind the other lanes' fsyncs); the next writer's open does the recovery,
        and the next verify checks that recovery lost nothing."""
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a crash leaves a torn tail at most, never damage
            archive = Archive(self.root)
            promised = committed(self.side)
            present = {cid for s in SHAPES for cid in archive.candidate_ids(s)}
        lost = [seq for seq, cid in promised[self.verified:] if cid not in present]
        assert not lost, f"committed records lost: {lost[:10]}"
        self.verified = len(promised)
        for shape in SHAPES:  # the newest records decode too
            ids = archive.candidate_ids(shape)
            if ids:
                assert archive.candidate(ids[-1]).id == ids[-1]
        self.torn += sum(shape_log.log.tail > 0 for shape_log in archive._shape_logs.values())  # peeking: no second scan
        archive.close()

    def finish(self) -> None:
        """Resume once more as the engine would (recovery), then read everything back."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            Archive(self.root, "w").close()
        self.verify()
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # after recovery, a reader sees a clean archive
            archive = Archive(self.root)
            seqs = [int(e.message) for s in SHAPES for e in archive.evaluations(s)]
        assert len(seqs) == len(set(seqs)), "a record was written twice"
        assert {seq for seq, _ in committed(self.side)} <= set(seqs), "a committed record is missing"

    def start(self, ctx: multiprocessing.context.BaseContext, max_delay: float) -> None:
        self.verify()
        if self.kills and self.kills % self.restarts == 0:
            self.finish()
            self.new_archive()  # keeps each archive, and each check, small
        self.proc = ctx.Process(target=writer, args=(str(self.root), str(self.side), self.rng.randrange(1 << 30)))
        self.proc.start()
        self.kill_at = time.monotonic() + self.rng.uniform(0.0, max_delay)

    def kill(self) -> None:
        assert self.proc is not None
        alive = self.proc.is_alive()
        os.kill(self.proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
        self.proc.join()
        assert alive and self.proc.exitcode == -signal.SIGKILL, f"writer died on its own (exit {self.proc.exitcode})"
        self.proc = None
        self.kills += 1


def run_kills(tmp_path: Path, kills: int, lanes: int, max_delay: float, seed: int, restarts: int = 25) -> list[Lane]:
    """SIGKILL ``kills`` writers in all, ``lanes`` archives at a time; check after each kill."""
    ctx = multiprocessing.get_context("fork")  # this process is single-threaded: forking is safe
    rng = random.Random(seed)
    all_lanes = [Lane(tmp_path / f"lane{i}", rng.randrange(1 << 30), restarts) for i in range(lanes)]
    try:
        while sum(lane.kills for lane in all_lanes) < kills:
            for lane in all_lanes:
                if lane.proc is None:
                    lane.start(ctx, max_delay)
            lane = min(all_lanes, key=lambda ln: ln.kill_at)
            time.sleep(max(0.0, lane.kill_at - time.monotonic()))
            lane.kill()
    finally:
        for lane in all_lanes:
            if lane.proc is not None:
                lane.proc.kill()
                lane.proc.join()
    for lane in all_lanes:
        lane.finish()
    return all_lanes


def test_sigkill_writer_200_times(tmp_path: Path) -> None:
    lanes = run_kills(tmp_path, kills=200, lanes=2, max_delay=0.03, seed=1)
    assert sum(ln.kills for ln in lanes) >= 200
    assert sum(ln.number for ln in lanes) >= 8, "archives were not resumed and rotated as planned"


@pytest.mark.slow
def test_sigkill_writer_2000_times(tmp_path: Path) -> None:
    lanes = run_kills(tmp_path, kills=2000, lanes=3, max_delay=0.1, seed=2, restarts=40)
    assert sum(ln.torn for ln in lanes) > 0, "no kill ever tore a tail: the test did not reach a write"
