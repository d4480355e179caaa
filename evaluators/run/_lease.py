"""A per-GPU lease between timed regions and LLM generation (issue 25).

A model generating on the GPU that times candidates spoils the measurements: its kernels share
the SMs and HBM with the timed graphs. The lease keeps them apart across processes (the GPU
worker times, the engine process or a local server generates) with two ``flock`` files per GPU,
named by the GPU's UUID (or its physical index) in :func:`lease_dir`:

- ``<key>.want``: a timer holds it shared from the moment it wants the GPU until its timed
  region ends; generation only checks it (a non-blocking exclusive try, released at once), so a
  waiting timer is seen before the next generation slice starts.
- ``<key>.gate``: timers hold it shared during the timed region (several timers may overlap, as
  without the lease); a generation *slice* holds it exclusively. A slice is one forward pass of
  an in-process model (or one request to a server or in-process vLLM) and ends with the device
  synchronised, so no generation kernel runs once the slice has released the gate.

Timing therefore waits at most one slice. It never waits longer than ``max_wait_s`` either: past
it the region runs anyway and the result says so (``gpu_lease.timed_out``), so a stuck server
cannot stall the evaluator. Generation waits as long as timers want the GPU (it runs while the
workers compile and check correctness). ``EVO_GPU_LEASE=off`` disables the lease;
``EVO_GPU_LEASE_DIR`` moves its files (default ``/dev/shm/evo-gpu-lease`` where ``/dev/shm``
exists, else the temporary directory).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

__all__ = ["GpuLease", "LeaseWait", "lease_dir", "gpu_key", "timing_lease", "lease_enabled", "LEASE_DIR_ENV",
           "LEASE_ENV"]

LEASE_DIR_ENV = "EVO_GPU_LEASE_DIR"
LEASE_ENV = "EVO_GPU_LEASE"
#: Seconds a timed region waits for a generation slice to end before it runs anyway.
MAX_WAIT_S = 2.0
#: Seconds between non-blocking lock attempts.
POLL_S = 0.0005


def lease_enabled() -> bool:
    return os.environ.get(LEASE_ENV, "on").strip().lower() not in ("off", "0", "false", "no")


def lease_dir() -> Path:
    """Where the lease files live (``EVO_GPU_LEASE_DIR``, else /dev/shm or the temporary directory)."""
    env = os.environ.get(LEASE_DIR_ENV)
    if env:
        return Path(env)
    base = Path("/dev/shm") if os.path.isdir("/dev/shm") else Path(tempfile.gettempdir())
    return base / "evo-gpu-lease"


def _physical_index(index: int) -> str:
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    return visible[index] if index < len(visible) else str(index)


def gpu_key(index: int = 0, uuid_of: Optional[Callable[[int], Optional[str]]] = None) -> str:
    """A name for visible GPU ``index`` that every process agrees on: its UUID where torch can
    say it, else its physical index (``CUDA_VISIBLE_DEVICES`` mapped back)."""
    uuid = None
    try:
        uuid = (uuid_of or _torch_uuid)(index)
    except Exception:  # no torch, no driver: fall back to the index
        uuid = None
    raw = f"uuid-{uuid}" if uuid else f"index-{_physical_index(index)}"
    return re.sub(r"[^A-Za-z0-9_.-]", "_", raw)


def _torch_uuid(index: int) -> Optional[str]:
    import torch

    if not torch.cuda.is_available():
        return None
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return str(uuid) if uuid else None


@dataclass
class LeaseWait:
    """What one timed region saw of the lease (recorded in the evaluation's measurement)."""

    waited_s: float = 0.0
    timed_out: bool = False
    enabled: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"waited_s": round(self.waited_s, 6), "timed_out": self.timed_out, "enabled": self.enabled}


@dataclass
class _Usage:
    slices: int = 0
    held_s: float = 0.0
    waited_s: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class GpuLease:
    """The lease of one GPU (see the module docstring); ``key`` is :func:`gpu_key`'s name."""

    def __init__(self, key: str, folder: Optional[os.PathLike] = None, *, poll_s: float = POLL_S) -> None:
        self.key = key
        self.folder = Path(folder) if folder is not None else lease_dir()
        self.poll_s = poll_s
        self.usage = _Usage()

    @classmethod
    def for_device(cls, index: int = 0, folder: Optional[os.PathLike] = None) -> "GpuLease":
        return cls(gpu_key(index), folder)

    def _open(self, suffix: str) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        return os.open(self.folder / f"{self.key}.{suffix}", os.O_RDWR | os.O_CREAT, 0o666)

    def _try(self, fd: int, mode: int) -> bool:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return False
            raise

    # -- the timing side ------------------------------------------------------------------
    @contextlib.contextmanager
    def timed(self, max_wait_s: float = MAX_WAIT_S) -> Iterator[LeaseWait]:
        """Hold the GPU against generation for a timed region: announce the want, wait for the
        running slice (at most ``max_wait_s``), hold the gate shared until the region ends."""
        wait = LeaseWait()
        want = gate = -1
        try:
            want, gate = self._open("want"), self._open("gate")
        except OSError:  # no lease directory: time anyway, and say so
            for fd in (want, gate):
                if fd >= 0:
                    os.close(fd)
            wait.enabled = False
            yield wait
            return
        try:
            fcntl.flock(want, fcntl.LOCK_SH)  # only ever held exclusively for an instant
            t0 = time.perf_counter()
            deadline = t0 + max_wait_s
            while not self._try(gate, fcntl.LOCK_SH):
                if time.perf_counter() >= deadline:
                    wait.timed_out = True
                    break
                time.sleep(self.poll_s)
            wait.waited_s = time.perf_counter() - t0
            yield wait
        finally:
            os.close(gate)  # closing drops its locks
            os.close(want)

    # -- the generation side --------------------------------------------------------------
    @contextlib.contextmanager
    def slice(self, sync: Optional[Callable[[], None]] = None,
              cancel: Optional[threading.Event] = None) -> Iterator[None]:
        """One generation slice: wait until no timer wants or holds the GPU, hold the gate
        exclusively, run the body, ``sync`` the device (so none of the slice's kernels outlives
        it), release. Counts slices, held and waited seconds in :attr:`usage`. A set ``cancel``
        ends the wait with :class:`InterruptedError`: the body never runs unleased."""
        want, gate = self._open("want"), self._open("gate")
        t0 = time.perf_counter()
        try:
            while True:
                if cancel is not None and cancel.is_set():
                    raise InterruptedError("generation cancelled while waiting for the GPU lease")
                if self._try(want, fcntl.LOCK_EX):
                    fcntl.flock(want, fcntl.LOCK_UN)  # nobody wants it now; the gate decides the race
                    if self._try(gate, fcntl.LOCK_EX):
                        break
                time.sleep(self.poll_s)
            t1 = time.perf_counter()
            try:
                yield
            finally:
                if sync is not None:
                    sync()
                t2 = time.perf_counter()
                with self.usage.lock:
                    self.usage.slices += 1
                    self.usage.held_s += t2 - t1
                    self.usage.waited_s += t1 - t0
        finally:
            os.close(gate)
            os.close(want)

    def summary(self) -> dict[str, Any]:
        with self.usage.lock:
            return {"key": self.key, "slices": self.usage.slices, "held_s": round(self.usage.held_s, 6),
                    "waited_s": round(self.usage.waited_s, 6)}


_PROCESS_LEASE: dict[int, GpuLease] = {}


@contextlib.contextmanager
def timing_lease(index: int = 0, max_wait_s: float = MAX_WAIT_S) -> Iterator[LeaseWait]:
    """The worker's hook: hold visible GPU ``index``'s lease for a timed region; the yielded
    wait (``enabled`` False when leases are off) is what the worker records in the evaluation's
    ``measurement.gpu_lease``."""
    if not lease_enabled():
        yield LeaseWait(enabled=False)
        return
    lease = _PROCESS_LEASE.get(index)
    if lease is None:
        lease = _PROCESS_LEASE[index] = GpuLease.for_device(index)
    with lease.timed(max_wait_s) as wait:
        yield wait
