"""Screen the plain peer's launch configurations for hangs in a child process (GPU machine).

The plain peer (``../shared/peers/plain_gemv.py``) is timed in the benchmark's own process, beside
cuBLAS and evo. On 2026-12-04 two of its configurations never returned on small decode rows
(1x80x432, 1x480x144), and a hung kernel takes the whole process with it. So before the time
stage, every (row, configuration) pair is launched once in a child process, one at a time; the
parent waits ``timeout_s`` for each, kills the child at the first that does not finish, records
that pair as hanging and starts a new child for the rest. The time stage then skips the hanging
pairs; the timing itself stays in the benchmark's process.

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
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

__all__ = ["screen", "Job", "import_peer"]

Job = tuple[int, int, int, str]  # (m, n, k, configuration name as PeerRunner names it)


def screen(peer: Path, jobs: Sequence[Job], *, timeout_s: float = 20.0, start_s: float = 120.0,
           deadline_s: Optional[float] = None, log: Callable[[str], None] = print,
           command: Optional[list[str]] = None) -> set[Job]:
    """The jobs not to time: those whose launch did not finish within ``timeout_s``, and with them
    the same shape's other configurations of the same kernel family (the name before ``<``: on
    2026-12-04 every ``mma<...>`` of 2x304x6128 hung, and each hang costs a new child that builds
    the peer again), and every job still unscreened ``deadline_s`` after the start. A child has
    ``start_s`` to say ``ready`` (it builds the peer's kernels first). A job that raised is not a
    hang (the time stage's own check refuses it). ``command``: the child's command line (default:
    this file with ``--child``)."""
    command = command or [sys.executable, str(Path(__file__).resolve()), "--child", str(peer)]
    todo, hung = list(jobs), set()
    end = None if deadline_s is None else time.monotonic() + deadline_s

    def left(limit: float) -> float:
        return limit if end is None else min(limit, end - time.monotonic())
    while todo:
        if end is not None and time.monotonic() >= end:
            log(f"peer screen: deadline reached; {len(todo)} configuration(s) not screened, skipped in the time stage")
            hung.update(todo)
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
                hung.update(todo)
                todo = []
                break
            while finished < len(todo):
                line = _readline(child, left(timeout_s))
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
    return hung


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

    sys.path.insert(0, str(Path(__file__).resolve().parent))
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
