"""The GPU worker starts torch's CPU pool before its first job (evaluators.run._harness.start_cpu_pool),
so the thread-count check compares like with like: a job whose host-side checks make the first big
CPU op is not flagged as a kernel that started host threads (an honest generic kernel was, on the H200)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROBE = """
import os, torch
from evaluators.run._harness import start_cpu_pool, thread_count
torch.set_num_threads(max(2, torch.get_num_threads()))
if {start}:
    start_cpu_pool()
before = thread_count()
x = torch.ones(1 << 22); x.mul_(2.0); x.sum()  # a host op big enough to split across threads
print(thread_count() - before)
"""


def _growth(start: bool) -> int:
    out = subprocess.run([sys.executable, "-c", PROBE.format(start=start)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.strip().splitlines()[-1])


def test_a_started_pool_does_not_grow_in_a_job():
    pytest.importorskip("torch")
    assert _growth(start=False) > 0, "the probe op does not start the pool: the test would prove nothing"
    assert _growth(start=True) == 0
