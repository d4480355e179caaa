"""A warm fork server for compile children: NVRTC initialised once, each compile a fresh fork.

Why: a compile child spawned from scratch pays for a new interpreter, loading libnvrtc and
NVRTC's first-compile initialisation; measured here that adds 0.3-0.8 s to a 0.5-2 s
template compile under load, while a child forked from a process that has already compiled
once compiles as fast as in-process. Isolation is unchanged: every compile still runs in its
own process, leads its own session/process group, has its own ``RLIMIT_AS``, and is killed as
a group on overrun.

Safety: the server is started as a fresh interpreter (``python _zygote.py``), never forked
from the caller, so it never inherits CUDA state or threads; it is single-threaded (a select
loop), and NVRTC leaves no threads behind after a compile (checked), so forking it is sound.

Protocol (length-prefixed pickles over the server's stdin/stdout): the parent sends
``("compile", id, request)`` and ``("kill", id)``; the server answers ``("ready",)`` once,
then ``("started", id, pid)`` and ``("done", id, pickled_result, exit_code)``. The server exits
and kills its children when its stdin closes (the parent exited or died).
"""
from __future__ import annotations

import itertools
import json
import os
import pickle
import queue
import signal
import struct
import subprocess
import sys
import threading
import time
from typing import Any

try:
    from ._outcome import classify, timeout_outcome
except ImportError:  # run as the fork server's script: this folder is sys.path[0]
    from _outcome import classify, timeout_outcome  # type: ignore[no-redef]

__all__ = ["Zygote", "ZygoteUnavailable", "zygote_for"]

_HEADER = struct.Struct(">Q")
_WARM = '#include <cuda_fp16.h>\nextern "C" __global__ void evo_warm(__half* x) { x[threadIdx.x] = __float2half(1.f); }\n'


class ZygoteUnavailable(RuntimeError):
    """The fork server could not start or died; callers fall back to spawning a child."""


def _frame(obj: Any) -> bytes:
    data = pickle.dumps(obj)
    return _HEADER.pack(len(data)) + data


# -- parent side -------------------------------------------------------------------------------
class Zygote:
    """Client of one fork server; thread-safe (one reader thread dispatches answers)."""

    def __init__(self, library: str | None, warm_flags: tuple[str, ...], start_timeout_s: float = 120) -> None:
        cfg = json.dumps({"library": library, "flags": list(warm_flags)})
        self.owner = os.getpid()
        self.proc = subprocess.Popen([sys.executable, __file__, cfg], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        self._write = threading.Lock()
        self._pending: dict[int, queue.Queue] = {}
        self._ids = itertools.count(1)
        self._ready = queue.Queue()
        self.dead = False
        threading.Thread(target=self._reader, name="evo-zygote-reader", daemon=True).start()
        try:
            self._ready.get(timeout=start_timeout_s)
        except queue.Empty:
            self.close()
            raise ZygoteUnavailable("the compile fork server did not start") from None
        if self.dead:
            raise ZygoteUnavailable("the compile fork server exited at start")

    def _reader(self) -> None:
        out = self.proc.stdout
        assert out is not None
        try:
            while True:
                head = out.read(_HEADER.size)
                if len(head) < _HEADER.size:
                    break
                msg = pickle.loads(out.read(_HEADER.unpack(head)[0]))
                if msg[0] == "ready":
                    self._ready.put(True)
                elif (q := self._pending.get(msg[1])) is not None:
                    q.put(msg)
        except Exception:
            pass
        self.dead = True
        self._ready.put(False)
        for q in list(self._pending.values()):
            q.put(("dead",))

    def _send(self, msg: Any) -> None:
        try:
            with self._write:
                assert self.proc.stdin is not None
                self.proc.stdin.write(_frame(msg))
                self.proc.stdin.flush()
        except (OSError, ValueError) as exc:
            self.dead = True
            raise ZygoteUnavailable(f"the compile fork server is gone: {exc}") from None

    def compile(self, request: dict, timeout_s: float):  # -> ChildOutcome
        rid = next(self._ids)
        q: queue.Queue = queue.Queue()
        self._pending[rid] = q
        t0 = time.monotonic()
        pid = 0
        try:
            self._send(("compile", rid, request))
            while True:
                try:
                    msg = q.get(timeout=max(0.0, t0 + timeout_s - time.monotonic()))
                except queue.Empty:
                    self._send(("kill", rid))
                    end = time.monotonic() + 10
                    while time.monotonic() < end:  # wait until the server has reaped it
                        try:
                            if q.get(timeout=max(0.0, end - time.monotonic()))[0] in ("done", "dead"):
                                break
                        except queue.Empty:
                            break
                    return timeout_outcome(request["backend"], timeout_s, time.monotonic() - t0, pid)
                if msg[0] == "started":
                    pid = msg[2]
                elif msg[0] == "done":
                    return classify(msg[2], msg[3], b"", request, time.monotonic() - t0, pid)
                else:
                    raise ZygoteUnavailable("the compile fork server died during a compile")
        finally:
            self._pending.pop(rid, None)

    def alive(self) -> bool:
        return not self.dead and self.proc.poll() is None and self.owner == os.getpid()

    def close(self) -> None:
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except Exception:
            self.proc.kill()


_LOCK = threading.Lock()
_CURRENT: Zygote | None = None
_FAILURES = 0


def zygote_for(library: str | None, warm_flags: tuple[str, ...]) -> Zygote:
    """This process's fork server, started (or restarted) on demand; gives up after 3 failed starts."""
    global _CURRENT, _FAILURES
    with _LOCK:
        if _CURRENT is not None and _CURRENT.alive():
            return _CURRENT
        if _FAILURES >= 3:
            raise ZygoteUnavailable("the compile fork server failed to start 3 times")
        try:
            _CURRENT = Zygote(library, warm_flags)
        except ZygoteUnavailable:
            _FAILURES += 1
            raise
        return _CURRENT


# -- server side -------------------------------------------------------------------------------
def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _serve() -> None:
    import select

    import _isolate  # this file's folder is sys.path[0]: the stdlib-only compile module, not the package

    cfg = json.loads(sys.argv[1])
    if cfg["library"] and cfg["flags"]:
        try:
            _isolate._nvrtc_compile(_WARM, cfg["flags"], cfg["library"])
        except Exception:
            pass  # a cold child still works
    out_fd = os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # nothing else may write into the protocol stream
    _write_all(out_fd, _frame(("ready",)))
    children: dict[int, list] = {}  # read fd -> [id, pid, chunks]
    pids: dict[int, int] = {}       # id -> pid
    buf = b""
    while True:
        ready, _, _ = select.select([0, *children], [], [])
        for fd in ready:
            if fd != 0:
                chunk = os.read(fd, 1 << 20)
                if chunk:
                    children[fd][2].append(chunk)
                    continue
                rid, pid, chunks = children.pop(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                pids.pop(rid, None)
                _write_all(out_fd, _frame(("done", rid, b"".join(chunks), os.waitstatus_to_exitcode(status))))
                continue
            data = os.read(0, 1 << 20)
            if not data:  # the parent is gone: take the children with us
                for _, pid, _ in children.values():
                    _kill(pid)
                for _, pid, _ in children.values():
                    os.waitpid(pid, 0)
                os._exit(0)
            buf += data
            while len(buf) >= _HEADER.size and len(buf) >= _HEADER.size + _HEADER.unpack(buf[:_HEADER.size])[0]:
                n = _HEADER.unpack(buf[:_HEADER.size])[0]
                msg, buf = pickle.loads(buf[_HEADER.size:_HEADER.size + n]), buf[_HEADER.size + n:]
                if msg[0] == "kill":
                    if msg[1] in pids:
                        _kill(pids[msg[1]])
                    continue
                rid, request = msg[1], msg[2]
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:  # the compile child
                    try:
                        os.setsid()
                        os.close(r)
                        for other in children:
                            os.close(other)
                        os.close(out_fd)
                        os.dup2(devnull, 0)
                        result = _isolate.compile_request(request)
                        _write_all(w, pickle.dumps(result))
                    finally:
                        os._exit(0)
                os.close(w)
                children[r] = [rid, pid, []]
                pids[rid] = pid
                _write_all(out_fd, _frame(("started", rid, pid)))


def _kill(pid: int) -> None:
    """Kill a child's process group (it called setsid) or, before it could, the child itself."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    _serve()
