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
    if any(name == "nobuild" for _, _, _, name in jobs):
        time.sleep(60)
    print("ready", flush=True)
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
    found = screen(Path("unused"), jobs, timeout_s=0.5, start_s=5, log=seen.append,
                   command=[sys.executable, str(script)])
    assert found.hung == {(1, 80, 432, "hang"), (2, 64, 64, "hang")}  # an error or a dead child is not a hang
    assert found.unscreened == frozenset() and found.skip == found.hung
    assert time.monotonic() - t < 20
    assert any("did not finish" in s for s in seen) and any("child ended" in s for s in seen)


def test_a_hang_takes_its_family_on_that_shape_and_the_deadline_bounds_the_screen(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(STAND_IN.replace('if name == "hang"', 'if name.startswith("hang")'))
    jobs = [(2, 304, 6128, "hang<1,1,4>"), (2, 304, 6128, "hang<1,2,8>"), (2, 304, 6128, "ok<1>"),
            (3, 304, 6128, "hang<1,2,8>"), (3, 304, 6128, "ok<2>")]
    seen: list[str] = []
    found = screen(Path("unused"), jobs, timeout_s=0.5, start_s=5, log=seen.append, command=[sys.executable, str(script)])
    # one child per hang, not per configuration: the sibling on the same shape goes with the first
    assert found.hung == {jobs[0], jobs[1], jobs[3]} and sum("did not finish" in s for s in seen) == 2
    t = time.monotonic()
    many = [(1, 64, 64, f"hang<{i}>") for i in range(3)] + [(1 + i, 64, 64, f"hang<{i}>") for i in range(1, 40)]
    found = screen(Path("unused"), many, timeout_s=0.5, start_s=5, deadline_s=2.0, log=seen.append,
                   command=[sys.executable, str(script)])
    assert found.skip == set(many) and time.monotonic() - t < 8 and any("deadline reached" in s for s in seen)
    # what the deadline left is reported as unscreened, not as hanging: only launches that ran out
    # their own timeout hang (4 children at once: about 4 per 0.5 s before the 2-s deadline)
    assert found.unscreened and found.hung and not found.hung & found.unscreened
    assert len(found.hung) <= 4 * 4 + 3


def test_a_child_that_never_gets_ready_skips_everything(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(STAND_IN)
    jobs = [(1, 64, 64, "ok"), (1, 64, 64, "nobuild")]
    seen: list[str] = []
    found = screen(Path("unused"), jobs, start_s=0.5, log=seen.append, command=[sys.executable, str(script)], workers=1)
    assert found.unscreened == set(jobs) and not found.hung
    assert any("did not get ready" in s for s in seen)


def test_nothing_to_screen_starts_nothing() -> None:
    assert screen(Path("unused"), [], command=["/nonexistent"]).skip == set()


def test_rows_are_screened_by_several_children_at_once(tmp_path: Path) -> None:
    """Eight rows, each with one hanging configuration: one child at a time pays 8 timeouts in
    turn, four children about two each; every row's own configurations stay in one child (the
    hang still takes its sibling)."""
    script = tmp_path / "child.py"
    script.write_text(STAND_IN.replace('if name == "hang"', 'if name.startswith("hang")'))
    jobs = [(1, 64 * r, 64, name) for r in range(1, 9) for name in ("hang<1>", "hang<2>", "ok<1>")]
    t = time.monotonic()
    found = screen(Path("unused"), jobs, timeout_s=1.0, start_s=5, log=lambda s: None,
                   command=[sys.executable, str(script)], workers=4)
    took = time.monotonic() - t
    assert found.hung == {j for j in jobs if j[3].startswith("hang")} and not found.unscreened
    assert took < 6.0, took  # one child at a time: at least 8 s
