"""The archive's writer lock: one ``flock``ed file per archive directory, holding who took it.

Kept apart from the archive so that the rule "exactly one writer" reads in one place: the lock
file's fixed-width JSON record (pid, host, since) names the holder in the error a second writer
gets, and a child forked while a writer is open closes its copy of the descriptor (the lock must
not outlive the parent, nor may the child write through it).
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import weakref
from typing import Callable

__all__ = ["WriterLock", "why", "writer_active"]

#: Bytes of the lock file's holder record (JSON: pid, host, since), written in place.
LOCK_WIDTH = 160


def why(exc: BaseException) -> str:
    """An OS error as a short sentence (``Permission denied``), else the exception's text."""
    return exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)


def _holder(raw: bytes) -> str:
    """Who holds the lock, from the lock file's record (older evo wrote the pid alone)."""
    text = raw.decode(errors="replace").strip()
    try:
        info = json.loads(text)
        return f"pid {info['pid']} on {info['host']} since {info['since']}"
    except (ValueError, TypeError, KeyError):
        return f"pid {text or '?'}"


def writer_active(path: str) -> bool:
    """Whether some process holds the writer lock at ``path`` now, found without taking it (a
    reader must never make a writer's start fail): Linux lists every flock in /proc/locks by
    device and inode. False where that cannot be read (then a reader treats a tail as damage)."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return False
    want = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    for line in lines:
        parts = line.split()
        if len(parts) >= 6 and parts[1] == "FLOCK" and parts[3] == "WRITE" and parts[5] == want:
            return True
    return False


class WriterLock:
    """An exclusive, non-blocking ``flock`` on ``path``; ``locked(message)`` builds the error
    raised when another process holds it (``message`` gets the holder's description)."""

    def __init__(self, path: str, locked: Callable[[str], Exception]) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(os.pread(fd, LOCK_WIDTH, 0))
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise locked(holder) from None
            raise
        since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        text = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": since})
        os.pwrite(fd, f"{text[:LOCK_WIDTH - 1]:<{LOCK_WIDTH - 1}}\n".encode(), 0)  # fixed width: no truncate
        self.fd = fd
        _HELD.add(self)

    @property
    def held(self) -> bool:
        """False once released here, or in a child forked while it was held."""
        return self.fd >= 0

    def release(self) -> None:
        """Close the descriptor, which releases the flock. Safe to call twice."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


#: Locks held in this process, for the fork hook below.
_HELD: "weakref.WeakSet[WriterLock]" = weakref.WeakSet()


def _release_in_child() -> None:
    for lock in list(_HELD):
        lock.release()  # the child's copy is closed: its archive's writes raise "closed"


os.register_at_fork(after_in_child=_release_in_child)
