"""Screen the plain peer's launch configurations for hangs in a child process (GPU machine).

The plain peer (``../shared/peers/plain_gemv.py``) is timed in the benchmark's own process, beside
cuBLAS and evo. On 2026-12-04 two of its configurations never returned on small decode rows
(1x80x432, 1x480x144), and a hung kernel takes the whole process with it. So before the time
stage, every (row, configuration) pair is launched once in a child process, one at a time; the
parent waits ``timeout_s`` for each, kills the child at the first that does not finish, records
that pair as hanging and starts a new child for the rest. The time stage then skips the hanging
pairs, and the pairs the deadline left unscreened; the timing itself stays in the benchmark's
process.

Rows are screened by ``workers`` children at once (a row's configurations all in one child, since
a hang takes its siblings on that row): each hang costs its child ``timeout_s`` and a rebuild of
the peer, and with one child a few hangs used the whole deadline (seed 6: 25 of 28 decode rows
left without a peer). A hung kernel in one child shares the GPU with the others' launches (time
slices between contexts) until its child is killed, which only slows them.

    python3 bench/_peer_screen.py --child PEER_PY < jobs.json      # the child (used by screen())

Protocol: the child reads the jobs (``[[m, n, k, name], ...]``) as JSON on stdin, builds the peer
and prints ``ready``, then for each job prints ``start I`` and then ``done I`` (or ``error I
MESSAGE``) on stdout, flushed.
"""
from __future__ import annotations

import importlib.util
import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["screen", "Screened", "Job", "import_peer"]

Job = tuple[int, int, int, str]  # (m, n, k, configuration name as PeerRunner names it)


@dataclass(frozen=True)
class Screened:
    """What the screen found: the jobs that hung (with their siblings on the same row) and the
    jobs it never reached (a deadline, a child that did not get ready). The time stage skips
    both; a report says which is which."""

    hung: frozenset
    unscreened: frozenset

    @property
    def skip(self) -> frozenset:
        return self.hung | self.unscreened


def screen(peer: Path, jobs: Sequence[Job], *, timeout_s: float = 5.0, start_s: float = 120.0,
           deadline_s: Optional[float] = None, log: Callable[[str], None] = print,
           command: Optional[list[str]] = None, workers: int = 4) -> Screened:
    """Screen ``jobs``: those whose launch did not finish within ``timeout_s`` hang, and with them
    the same shape's other configurations of the same kernel family (the name before ``<``: on
    2026-12-04 every ``mma<...>`` of 2x304x6128 hung, and each hang costs a new child that builds
    the peer again); every job still unscreened ``deadline_s`` after the start is left out. A
    child has ``start_s`` to say ``ready`` (it builds the peer's kernels first). A job that
    raised is not a hang (the time stage's own check refuses it). ``workers`` children run at
    once, each over whole rows. ``command``: the child's command line (default: this file with
    ``--child``). A decode launch takes microseconds once the peer is built, so ``timeout_s`` is
    seconds of slack, not a runtime estimate."""
    command = command or [sys.executable, str(Path(__file__).resolve()), "--child", str(peer)]
    end = None if deadline_s is None else time.monotonic() + deadline_s
    n = max(1, workers)
    child_of = {row: i % n for i, row in enumerate(dict.fromkeys(j[:3] for j in jobs))}  # rows dealt in turn
    parts = [p for p in ([j for j in jobs if child_of[j[:3]] == w] for w in range(n)) if p]
    found = [(set(), set()) for _ in parts]
    lock = threading.Lock()

    def say(line: str) -> None:
        with lock:
            log(line)
    threads = [threading.Thread(target=_screen_part, args=(command, part, timeout_s, start_s, end, say, out), daemon=True)
               for part, out in zip(parts, found)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hung = frozenset(j for h, _ in found for j in h)
    return Screened(hung, frozenset(j for _, u in found for j in u) - hung)


def _screen_part(command: list[str], jobs: Sequence[Job], timeout_s: float, start_s: float, end: Optional[float],
                 log: Callable[[str], None], out: tuple[set, set]) -> None:
    """One child at a time over ``jobs`` (see :func:`screen`); the hanging jobs into ``out[0]``,
    the ones left unscreened into ``out[1]``."""
    todo, (hung, unscreened) = list(jobs), out

    def left(limit: float) -> float:
        return limit if end is None else min(limit, end - time.monotonic())
    while todo:
        if end is not None and time.monotonic() >= end:
            log(f"peer screen: deadline reached; {len(todo)} configuration(s) not screened, skipped in the time stage")
            unscreened.update(todo)
            break
        child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write(json.dumps([list(j) for j in todo]))
        child.stdin.close()
        finished = 0
        try:
            line = _readline(child, left(start_s))
            if line != "ready":  # the build hung, died or said something else: nothing can be screened
                log(f"peer screen: the child did not get ready ({line!r}); {len(todo)} configuration(s) skipped")
                unscreened.update(todo)
                todo = []
                break
            while finished < len(todo):
                line = _readline(child, left(timeout_s))
                if line is None and end is not None and time.monotonic() >= end:
                    break  # the deadline, not the job: what is left is unscreened (the loop says so)
                if line is None:  # no word within the limit: the job in hand hangs, and its siblings go too
                    job = todo[finished]
                    family = [j for j in todo[finished:] if j[:3] == job[:3] and _family(j[3]) == _family(job[3])]
                    hung.update(family)
                    log(f"peer screen: {job} did not finish in {timeout_s:.0f} s; it and {len(family) - 1} sibling(s) "
                        "skipped in the time stage")
                    finished += 1
                    break
                if line.startswith(("done ", "error ")):
                    finished += 1
                elif line == "":  # the child died: what it was doing counts as a failure, not a hang
                    log(f"peer screen: the child ended at {todo[finished]} (code {child.poll()})")
                    finished += 1
                    break
        finally:
            child.kill()
            child.wait()
        todo = [j for j in todo[finished:] if j not in hung]


def _family(name: str) -> str:
    return name.split("<", 1)[0]


def import_peer(path: Path, name: str = "plain_gemv_peer") -> Any:
    """A peer module, imported from its file (peers are yardsticks: never copied into the repository)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _readline(child: subprocess.Popen, limit: float) -> Optional[str]:
    """The child's next line, '' at its end, None when nothing came within ``limit`` seconds."""
    assert child.stdout is not None
    deadline = time.monotonic() + limit
    fd = child.stdout.fileno()
    buf = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 1)
        if not chunk:
            return ""
        if chunk == b"\n":
            return buf.decode(errors="replace")
        buf += chunk


def _child(peer_path: str) -> int:  # pragma: no cover - runs on the GPU machine
    import torch

    here = Path(__file__).resolve().parent
    sys.path[:0] = [str(here), str(here.parent)]  # bench/ and the checkout (evo), without PYTHONPATH set
    from _llm_timer import PeerRunner

    jobs = [tuple(j) for j in json.load(sys.stdin)]
    runner = PeerRunner(import_peer(Path(peer_path)), sorted({j[0] for j in jobs}))
    print("ready", flush=True)
    operands: dict[tuple[int, int, int], Any] = {}
    for i, (m, n, k, name) in enumerate(jobs):
        print(f"start {i}", flush=True)
        try:
            if (m, n, k) not in operands:
                operands.clear()
                operands[(m, n, k)] = (torch.randn(m, k, device="cuda", dtype=torch.half),
                                       torch.randn(n, k, device="cuda", dtype=torch.half),
                                       torch.empty(m, n, device="cuda", dtype=torch.half))
            a, w, c = operands[(m, n, k)]
            launch = runner.launch_of(name)
            launch(a, w, c)
            torch.cuda.synchronize()
            print(f"done {i}", flush=True)
        except Exception as exc:  # noqa: BLE001 - reported, the next job goes on
            print(f"error {i} {type(exc).__name__}: {str(exc)[:120]}".replace("\n", " "), flush=True)
    return 0


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        sys.exit(_child(sys.argv[2]))
    print("usage: _peer_screen.py --child PEER_PY < jobs.json", file=sys.stderr)
    sys.exit(2)
