"""A two-"node" Ray cluster on one host for bench/ray_scaling.py (issue 23): two ``ray start
--block`` processes, each with its own GPU set (``CUDA_VISIBLE_DEVICES`` and ``--num-gpus``)
and half of the CPUs, so that GPU actors and compile tasks really run on two raylets and the
multi-node path (placement, results crossing nodes, a node lost and rejoining) is exercised.

Each node runs in its own process group (``start_new_session``), so stopping or killing one
node ends exactly the processes that node started and nothing else on the machine (never
``ray stop``, which ends every Ray on the host). Token authentication is switched off for the
private cluster (``RAY_AUTH_MODE=disabled`` for the nodes and this driver): it listens on this
host only, under a temp dir of its own, which ``ray.init(address="auto")`` elsewhere never finds.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Optional, Sequence

__all__ = ["TwoNodes"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TwoNodes:
    """A head node and a worker node on this host; ``gpu_sets`` are the physical GPU ids of each
    (logical ids on a CPU machine: Ray then only counts them). ``cpus`` split between the two."""

    def __init__(self, gpu_sets: Sequence[Sequence[str]], cpus: int, log_dir: Path) -> None:
        if len(gpu_sets) != 2 or not all(gpu_sets):
            raise ValueError(f"two non-empty GPU sets are needed, got {gpu_sets!r}")
        self.gpu_sets = [list(g) for g in gpu_sets]
        self.cpus = [max(1, cpus // 2), max(1, cpus - cpus // 2)]
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.temp_dir = tempfile.mkdtemp(prefix="evo-ray-", dir="/tmp")  # short: Ray's socket paths
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.procs: list[Optional[subprocess.Popen]] = [None, None]
        os.environ["RAY_AUTH_MODE"] = "disabled"  # this driver joins the private cluster too

    def _command(self, node: int) -> list[str]:
        common = ["--block", "--num-cpus", str(self.cpus[node]), "--num-gpus", str(len(self.gpu_sets[node])),
                  "--node-ip-address", "127.0.0.1", "--disable-usage-stats"]
        if node == 0:
            return ["ray", "start", "--head", "--port", str(self.port), "--temp-dir", self.temp_dir,
                    "--include-dashboard=false", "--object-store-memory", str(1 << 30), *common]
        return ["ray", "start", "--address", self.address, "--object-store-memory", str(512 << 20), *common]

    def start_node(self, node: int, timeout_s: float = 180.0) -> None:
        """Start node 0 (the head) or 1 and wait until the cluster counts its GPUs."""
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(self.gpu_sets[node]), "RAY_AUTH_MODE": "disabled"}
        log = open(self.log_dir / f"ray-node{node}.log", "a")
        self.procs[node] = subprocess.Popen(self._command(node), env=env, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True)
        log.close()
        if node == 0:
            self._wait_log(self.log_dir / "ray-node0.log", "Ray runtime started", timeout_s)

    def start(self) -> str:
        """Both nodes; returns the address to ``ray.init`` with."""
        self.start_node(0)
        self.start_node(1)
        return self.address

    def kill_node(self, node: int) -> None:
        """SIGKILL every process of ``node`` (its raylet, workers, actors): a lost machine."""
        proc = self.procs[node]
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=30)
        self.procs[node] = None

    def stop(self) -> None:
        """End both nodes: SIGTERM to each process group, SIGKILL what is left after 15 s."""
        for node in (1, 0):
            proc = self.procs[node]
            if proc is None:
                continue
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=15)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.kill_node(node)
            self.procs[node] = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    @staticmethod
    def _wait_log(path: Path, text: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if text in path.read_text(errors="replace"):
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the Ray head did not start within {timeout_s:g} s (see {path})")

    def __enter__(self) -> "TwoNodes":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
