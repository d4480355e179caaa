"""bench/_peer_screen.py: the plain peer's configurations screened for hangs in a child process.

The child here is a test double (a short Python script standing in for the GPU child, a boundary
this test does not own): it speaks the same line protocol and hangs, raises or dies on chosen jobs.
"""
from __future__ import annotations

import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from _peer_screen import screen  # noqa: E402

STAND_IN = textwrap.dedent('''
    import json, sys, time, os
    jobs = json.load(sys.stdin)
    for i, (m, n, k, name) in enumerate(jobs):
        print(f"start {i}", flush=True)
        if name == "hang":
            time.sleep(60)
        if name == "die":
            os._exit(3)
        if name == "raise":
            print(f"error {i} RuntimeError: bad", flush=True)
            continue
        print(f"done {i}", flush=True)
''')


def test_a_hanging_job_is_reported_and_the_rest_still_run(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(STAND_IN)
    jobs = [(1, 80, 432, "ok"), (1, 80, 432, "hang"), (1, 80, 432, "raise"), (2, 64, 64, "die"),
            (2, 64, 64, "hang"), (2, 64, 64, "ok")]
    seen: list[str] = []
    t = time.monotonic()
    hung = screen(Path("unused"), jobs, timeout_s=0.5, start_s=5, log=seen.append,
                  command=[sys.executable, str(script)])
    assert hung == {(1, 80, 432, "hang"), (2, 64, 64, "hang")}  # an error or a dead child is not a hang
    assert time.monotonic() - t < 20
    assert any("did not finish" in s for s in seen) and any("child ended" in s for s in seen)


def test_nothing_to_screen_starts_nothing() -> None:
    assert screen(Path("unused"), [], command=["/nonexistent"]) == set()
