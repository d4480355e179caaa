"""SIGKILL during archive writes: no committed record lost, no damaged open (issue 38).

Four writers, each killed again and again at a random moment while it writes, resuming the same
archive every time:

- ``seed``: ``evo seed`` (a new shape per round, so every round writes);
- ``run``: ``evo run`` with the test-double pool (tests/fake_evo.py: evaluations at CPU speed);
- ``compact``: a loop of ``Archive.record`` + ``Archive.compact`` (logs rewritten and renamed);
- ``repair``: ``evo archive check --repair`` of a damaged archive (killed mid-copy).

Every 25 rounds the writer starts on a fresh archive (the checks below stay cheap). After each
kill the archive is opened as a resuming writer would (every frame checksummed, the
side index compared) and as a reader. Counted:

- lost: a record id seen after an earlier kill that is gone now (committed records never vanish);
- damaged opens: an open that reports anything but a torn tail (the uncommitted write the kill
  cut, which the writer truncates after keeping its bytes in a ``.torn`` side file), or fails;
- for ``repair``: a ``.repaired`` directory that exists but is not a whole archive.

    PYTHONPATH=. python bench/kill_bench.py --kills 130 [--modes seed,run,compact,repair] [--seed 0]
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from populations import Archive, Candidate, Evaluation, Launch, LaunchPlan, Shape, Status, check_archive  # noqa: E402

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
#: Rounds per archive: then a fresh one, so that checking after each kill stays cheap.
ROTATE = 25
PLAN = LaunchPlan(launches=(Launch("k", ("cdiv(N, 128)", "cdiv(M, 128)", 1), (256, 1, 1), ("A", "B", "C", "M", "N", "K")),))

COMPACT_CHILD = """
import sys, random
from populations import Archive, Candidate, Evaluation, Launch, LaunchPlan, Shape, Status
plan = LaunchPlan(launches=(Launch("k", (1, 1, 1), (32, 1, 1), ("A", "B", "C", "M", "N", "K")),))
rng = random.Random(int(sys.argv[2]))
shapes = [Shape(64 * (1 + i), 64, 64) for i in range(3)]
with Archive(sys.argv[1], "w") as a:
    for round in range(100000):
        for _ in range(20):
            c = Candidate(source=f"// {rng.random()}", plan=plan, shapes=(rng.choice(shapes),))
            a.record(c, [Evaluation(c.id, c.shapes[0], Status.OK)])
        a.commit()
        if round % 3 == 0:
            a.compact()
"""


def ids(path: Path) -> set[tuple[str, str]]:
    """Every (shape, record key) the archive holds, read as a reader."""
    out = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = Archive(path, "r")
        try:
            for shape in a.shapes():
                out |= {(str(shape), cid) for cid in a.candidate_ids(shape)}
        finally:
            a.close()
    return out


def open_problems(path: Path) -> list[str]:
    """What a resuming writer's open reports, without its torn tails (the kill's uncommitted write)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        a = Archive(path, "w", verify=True)
        try:
            return [p for p in a.problems() if "torn tail" not in p]
        finally:
            a.close()


def child(mode: str, path: Path, rnd: int, work: Path) -> list[str]:
    if mode == "seed":
        shape = f"{128 + 16 * (rnd % 200)}x{128 + 16 * (rnd // 200)}x256"
        return [sys.executable, "-m", "evo", "seed", str(path), "--shape", shape, "--per-template", "4",
                "--arch", "sm_90a"]
    if mode == "run":
        return [sys.executable, "-m", "fake_evo", "run", str(path), "--shape", "256x256x256", "--shape", "512x256x128",
                "--max-evals", "400", "--progress", "none", "--arch", "sm_90a"]
    if mode == "compact":
        return [sys.executable, "-c", COMPACT_CHILD, str(path), str(rnd)]
    return [sys.executable, "-m", "evo", "archive", "check", str(path), "--repair", "--out", str(work / "fixed")]


def prepare_repair_source(path: Path) -> None:
    """A damaged archive to repair: 6,000 records over 4 shapes, one byte flipped in each log."""
    with Archive(path, "w") as a:
        for i in range(3000):
            c = Candidate(source=f"// {i} " + "x" * 2000, plan=PLAN, shapes=(Shape(64 * (1 + i % 4), 64, 64),))
            a.record(c, [Evaluation(c.id, c.shapes[0], Status.OK)])
    for log in path.glob("*.evolog"):
        data = bytearray(log.read_bytes())
        data[len(data) // 2] ^= 0x33
        log.write_bytes(bytes(data))


def bench(mode: str, kills: int, rng: random.Random, work: Path) -> dict[str, int]:
    path = work / "a"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    if mode == "repair":
        prepare_repair_source(path)
    stats = {"kills": 0, "lost": 0, "damaged_opens": 0, "torn_tails": 0, "finished_before_kill": 0, "bad_copies": 0,
             "records_seen": 0}
    seen: set[tuple[str, str]] = set()
    lo, hi = {"seed": (0.05, 0.4), "run": (0.3, 3.0), "compact": (0.1, 1.0), "repair": (0.3, 2.0)}[mode]
    rnd = 0
    while stats["kills"] < kills:
        rnd += 1
        if mode != "repair" and rnd % ROTATE == 0:  # a fresh archive now and then: checking stays cheap
            stats["records_seen"] += len(seen)
            seen = set()
            shutil.rmtree(path, ignore_errors=True)
        proc = subprocess.Popen(child(mode, path, rnd, work), env=ENV, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, cwd=ROOT)
        time.sleep(rng.uniform(lo, hi))
        if proc.poll() is not None:
            stats["finished_before_kill"] += 1
        else:
            proc.send_signal(signal.SIGKILL)
            stats["kills"] += 1
        proc.wait()
        if mode == "repair":
            fixed = work / "fixed"
            if fixed.exists():
                if not check_archive(fixed).ok:
                    stats["bad_copies"] += 1
                shutil.rmtree(fixed)
            continue
        torn = len(list(path.glob("*.torn")))
        try:
            bad = open_problems(path)
        except Exception as exc:  # noqa: BLE001 - a failed open is what this counts
            bad = [f"open failed: {exc}"]
        stats["torn_tails"] += len(list(path.glob("*.torn"))) - torn
        if bad:
            stats["damaged_opens"] += 1
            print(f"  {mode} round {rnd}: {bad[:2]}", file=sys.stderr)
        now = ids(path)
        stats["lost"] += len(seen - now)
        seen |= now
    stats["records_seen"] += len(seen)
    return stats


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=130, help="SIGKILLs per mode (default 130: 520 over four modes)")
    p.add_argument("--modes", default="seed,run,compact,repair")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    total = {}
    with tempfile.TemporaryDirectory(prefix="evo-kill-") as tmp:
        for mode in args.modes.split(","):
            t0 = time.monotonic()
            stats = bench(mode, args.kills, rng, Path(tmp) / mode)
            total[mode] = stats
            print(f"{mode}: {stats} ({time.monotonic() - t0:.0f} s)", flush=True)
    kills = sum(s["kills"] for s in total.values())
    lost = sum(s["lost"] for s in total.values())
    damaged = sum(s["damaged_opens"] + s["bad_copies"] for s in total.values())
    print(f"total: {kills} kills, {lost} committed records lost, {damaged} damaged opens or copies")
    return 0 if lost == 0 and damaged == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
