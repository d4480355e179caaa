"""GPU worker processes and the supervisor that keeps them honest and alive.

One worker process per GPU runs the harness (load, correctness, timing) for one job at a time.
A candidate kernel can hang the GPU, poison the CUDA context or kill its process, so the
worker is disposable and the parent never touches CUDA:

- The worker is a fresh interpreter (``python -m evaluators.run._worker``; the ``spawn`` semantics:
  nothing is inherited from the parent's memory, so no fork after CUDA init can happen), started
  with ``start_new_session=True`` so that it and anything it starts form one process group that
  one ``killpg(SIGKILL)`` ends. ``multiprocessing``'s spawn context cannot give a new session or
  redirect a child's C-level stdout, which is why it is started through ``subprocess``.
- Messages go over a socketpair wrapped in a ``multiprocessing`` Connection (length-framed
  pickles), never through stdout; the worker's stdout and stderr (driver messages, tracebacks)
  go to a log file whose tail is quoted in failure messages.
- The worker announces each phase (``load``, ``correctness``, ``timing``); the supervisor gives
  each phase its own deadline. On overrun or death (EOF, a signal, an exit code) it kills the
  process group, reaps it, reports ``timeout`` or ``runtime_error`` for the job, starts a new
  worker and runs a health probe (a known-good tiny kernel) before giving it more work.
- A worker that hits a context-poisoning CUDA error (illegal address, trap, misaligned access)
  reports the job with ``fatal=True`` and exits; the supervisor restarts it the same way.

Message protocol (tuples): parent -> child ``("job", id, dict)``, ``("probe", id, {})``,
``("stop",)``; child -> parent ``("ready", info)``, ``("phase", id, name)``,
``("partial", id, dict)`` (one finished shape, kept if the job later dies or overruns),
``("result", id, dict)``. A result dict has at least ``status`` and ``message``.

The worker's behaviour is a *handler* named by ``target`` (``"module:factory"``); the factory
gets the options dict and returns an object with ``info() -> dict`` and
``handle(kind, job, phase) -> dict``; ``phase(name)`` announces a phase and
``phase("partial", shape_result)`` reports a finished shape early. The real one is :func:`evaluators.run._harness.make_handler`;
tests use a fake one that crashes on demand.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Mapping, Optional

from populations import Status

__all__ = ["WorkerSupervisor", "WorkerUnavailable", "DEFAULT_DEADLINES", "HARNESS_TARGET", "worker_env"]

HARNESS_TARGET = "evaluators.run._harness:make_handler"
#: Seconds each phase may take before the worker is killed. ``startup`` covers importing torch,
#: creating the context and measuring the ceilings; jobs may scale the GPU phases for big shapes.
DEFAULT_DEADLINES: dict[str, float] = {
    "startup": 180.0, "probe": 60.0, "load": 30.0, "correctness": 120.0, "timing": 180.0,
}
FATAL_EXIT = 70  # the worker's exit code after a context-poisoning error it reported itself


class WorkerUnavailable(RuntimeError):
    """The worker could not be (re)started or failed its health probe repeatedly."""


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


def worker_env(gpu: Optional[int], extra: Optional[Mapping[str, str]] = None) -> dict[str, str]:
    """Environment of a worker: the parent's, one visible GPU, the parent's import path."""
    env = dict(os.environ)
    if gpu is not None:
        visible = [v for v in env.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
        env["CUDA_VISIBLE_DEVICES"] = visible[gpu] if gpu < len(visible) else str(gpu)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where `evaluators` lives
    paths = [root] + [p for p in sys.path if p and os.path.isdir(p) and p != root]
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join(paths + ([old] if old else []))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra or {})
    return env


class WorkerSupervisor:
    """Owns one worker process for one GPU: start, run jobs under deadlines, restart, probe.

    ``run`` never raises for anything a candidate does; it returns a result dict whose
    ``status`` is ``timeout`` or ``runtime_error`` when the worker died or overran. It raises
    :class:`WorkerUnavailable` only when a fresh worker cannot pass its health probe.
    """

    def __init__(self, gpu: Optional[int] = 0, *, target: str = HARNESS_TARGET,
                 options: Optional[Mapping[str, Any]] = None, log_dir: Optional[str] = None,
                 deadlines: Optional[Mapping[str, float]] = None, env: Optional[Mapping[str, str]] = None,
                 probe: bool = True, max_start_attempts: int = 3) -> None:
        self.gpu = gpu
        self.target = target
        self.options = dict(options or {})
        self.deadlines = {**DEFAULT_DEADLINES, **(deadlines or {})}
        self.extra_env = dict(env or {})
        self.probe_enabled = probe
        self.max_start_attempts = max_start_attempts
        log_dir = log_dir or os.path.join(tempfile.gettempdir(), "evo-workers")
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, f"worker-gpu{gpu if gpu is not None else 'x'}-{os.getpid()}.log")
        self.info: dict[str, Any] = {}
        self.restarts = 0      # times a worker was replaced after a failure
        self.probes_passed = 0
        self._proc: Optional[subprocess.Popen] = None
        self._conn: Optional[Connection] = None
        self._ids = itertools.count(1)
        self._started = False

    # -- life cycle -----------------------------------------------------------------------
    @property
    def pid(self) -> Optional[int]:
        return self._proc.pid if self._proc is not None else None

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> dict[str, Any]:
        """Start (or restart) the worker and probe it; return its ready info."""
        last = "never started"
        for _ in range(self.max_start_attempts):
            self._kill()
            try:
                self._spawn()
                if self.probe_enabled:
                    res = self._exchange("probe", {}, first_phase="probe")
                    if res.get("status") != Status.OK:
                        last = f"health probe failed: {res.get('message', '')}"
                        continue
                    self.probes_passed += 1
                self._started = True
                return self.info
            except WorkerUnavailable as exc:
                last = str(exc)
        self._kill()
        raise WorkerUnavailable(f"GPU worker {self.gpu} unusable after {self.max_start_attempts} starts: {last}")

    def close(self) -> None:
        """Ask the worker to stop, then make sure its whole process group is gone."""
        if self.alive() and self._conn is not None:
            try:
                self._conn.send(("stop",))
                self._proc.wait(timeout=5)  # type: ignore[union-attr]
            except (OSError, EOFError, subprocess.TimeoutExpired):
                pass
        self._kill()

    def __enter__(self) -> "WorkerSupervisor":
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- jobs ---------------------------------------------------------------------------
    def run(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """Run one job; on death, overrun or a fatal CUDA error restart the worker (with probe)."""
        if not self.alive():
            if self._started:
                self.restarts += 1
            self.start()
        try:
            result = self._exchange("job", job, first_phase="load")
        except WorkerUnavailable as exc:  # died while starting the job: treat like any death
            result = {"status": Status.RUNTIME_ERROR, "message": str(exc), "fatal": True}
        if result.get("fatal") or not self.alive():
            self.restarts += 1
            self.start()
        return result

    def _exchange(self, kind: str, job: Mapping[str, Any], first_phase: str) -> dict[str, Any]:
        assert self._conn is not None
        job_id = next(self._ids)
        deadlines = {**self.deadlines, **(job.get("deadlines") or {})}
        phase = first_phase
        deadline = time.monotonic() + deadlines.get(phase, 60.0)
        partials: list[Any] = []
        try:
            self._conn.send((kind, job_id, dict(job)))
        except OSError as exc:
            return {**self._died(phase, f"could not send the job: {exc}"), "shapes": partials}
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                return {"status": Status.TIMEOUT, "fatal": True, "phase": phase, "shapes": partials,
                        "message": f"{phase} phase overran its {deadlines.get(phase, 60.0):g} s deadline; "
                                   f"worker killed (SIGKILL to its process group)"}
            try:
                ready = self._conn.poll(min(remaining, 0.5))
            except OSError:
                ready = True
            if not ready:
                if self._proc is not None and self._proc.poll() is not None:
                    return {**self._died(phase), "shapes": partials}
                continue
            try:
                msg = self._conn.recv()
            except (EOFError, OSError):
                return {**self._died(phase), "shapes": partials}
            if msg[0] == "partial" and msg[1] == job_id:
                partials.append(msg[2])
            elif msg[0] == "phase" and msg[1] == job_id:
                phase = msg[2]
                deadline = time.monotonic() + deadlines.get(phase, 60.0)
            elif msg[0] == "result" and msg[1] == job_id:
                result = dict(msg[2])
                if result.get("fatal"):
                    self._reap(grace=10.0)
                return result

    # -- process handling ------------------------------------------------------------------
    def _spawn(self) -> None:
        parent_sock, child_sock = socket.socketpair()
        log = open(self.log_path, "ab", buffering=0)
        log.write(f"\n=== worker start {time.strftime('%Y-%m-%d %H:%M:%S')} gpu={self.gpu} target={self.target}\n".encode())
        cmd = [sys.executable, "-c", "import sys; from evaluators.run._worker import main; sys.exit(main())",
               "--fd", str(child_sock.fileno()),
               "--target", self.target, "--options", repr(self.options), "--parent", str(os.getpid())]
        try:
            self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                          pass_fds=(child_sock.fileno(),), start_new_session=True,
                                          env=worker_env(self.gpu, self.extra_env), close_fds=True)
        finally:
            child_sock.close()
            log.close()
        self._conn = Connection(parent_sock.detach())
        deadline = time.monotonic() + self.deadlines["startup"]
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                raise WorkerUnavailable(f"worker did not become ready within {self.deadlines['startup']:g} s")
            try:
                if self._conn.poll(min(remaining, 0.5)):
                    msg = self._conn.recv()
                    if msg[0] == "ready":
                        self.info = dict(msg[1])
                        return
                elif self._proc.poll() is None:
                    continue
                else:
                    raise EOFError
            except (EOFError, OSError):
                res = self._died("startup")
                raise WorkerUnavailable(res["message"]) from None

    def _died(self, phase: str, why: str = "") -> dict[str, Any]:
        code = self._reap(grace=5.0)
        if code is None:
            how = "closed its channel"
        elif code < 0:
            how = f"died with {_signal_name(-code)} (signal {-code})"
        elif code == FATAL_EXIT:
            how = "exited after a fatal CUDA error"
        else:
            how = f"exited with code {code}"
        tail = self.log_tail()
        message = f"worker {how} during the {phase} phase" + (f": {why}" if why else "")
        if tail:
            message += f"; log tail: {tail}"
        return {"status": Status.RUNTIME_ERROR, "fatal": True, "phase": phase, "message": message, "exit_code": code}

    def _reap(self, grace: float) -> Optional[int]:
        """Wait a little for the worker to exit by itself, then kill its group; return its exit code."""
        if self._proc is None:
            return None
        try:
            self._proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        return self._kill()

    def _kill(self) -> Optional[int]:
        proc, self._proc = self._proc, None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if proc is None:
            return None
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the group outlives its leader: always kill it
        except (ProcessLookupError, PermissionError):
            pass
        if proc.poll() is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:  # stuck in the driver; leave it to the kernel
            return None

    def log_tail(self, lines: int = 6, limit: int = 800) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - 8192))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        text = text.rsplit("=== worker start", 1)[-1]
        tail = [ln for ln in text.splitlines()[1:] if ln.strip()][-lines:]
        return " | ".join(tail)[-limit:]


# -- the worker side ---------------------------------------------------------------------------
def load_target(target: str) -> Callable[[dict], Any]:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name or "make_handler")


def serve(conn: Connection, handler: Any) -> int:
    """The worker's loop: one job at a time until ``stop`` or EOF.

    With ``EVO_WORKER_PROFILE=DIR`` the handler runs under cProfile and the cumulative stats are
    written to ``DIR/worker-<pid>.prof`` after every job (a killed worker keeps what it had)."""
    prof_dir = os.environ.get("EVO_WORKER_PROFILE")
    if prof_dir:
        import cProfile

        os.makedirs(prof_dir, exist_ok=True)
        profiler = cProfile.Profile()
        base = handler

        class _Profiled:
            def info(self) -> Any:
                return base.info()

            def handle(self, kind: str, job: Any, phase: Callable[..., None]) -> Any:
                try:
                    return profiler.runcall(base.handle, kind, job, phase)
                finally:
                    profiler.dump_stats(os.path.join(prof_dir, f"worker-{os.getpid()}.prof"))
        handler = _Profiled()
    conn.send(("ready", handler.info()))
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        if msg[0] == "stop":
            return 0
        kind, job_id, job = msg
        def phase(name: str, payload: Any = None, _id: int = job_id) -> None:
            conn.send(("partial", _id, payload) if name == "partial" else ("phase", _id, name))

        try:
            result = handler.handle(kind, job, phase)
        except Exception as exc:  # the handler's own bug: report it, keep serving
            result = {"status": Status.RUNTIME_ERROR, "message": f"harness error: {exc!r}\n{traceback.format_exc()}"}
        conn.send(("result", job_id, result))
        if result.get("fatal"):
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(FATAL_EXIT)


def _exit_with_parent(parent: int, every_s: float = 0.5) -> None:
    """Exit when the supervisor is gone (this process was re-parented), even in the middle of a job.

    An idle worker sees EOF on its channel and stops; a busy one (a hung kernel, a long timing
    pass) would not, and it runs in its own session, so a supervisor killed by SIGKILL (or a Ray
    actor torn down) would leave it holding the GPU and its memory. A polling thread, not
    PR_SET_PDEATHSIG: that fires when the spawning *thread* exits, and pool threads may come
    and go while the supervisor lives. ``os._exit`` works while the main thread is stuck."""
    import threading

    def watch() -> None:
        while True:
            time.sleep(every_s)
            if os.getppid() != parent:
                print(f"evo worker: supervisor {parent} is gone; exiting", flush=True)
                os._exit(FATAL_EXIT)
    if os.getppid() != parent:  # gone before we started
        os._exit(FATAL_EXIT)
    threading.Thread(target=watch, name="evo-parent-watch", daemon=True).start()


def main(argv: Optional[list[str]] = None) -> int:
    import ast

    parser = argparse.ArgumentParser(description="evo GPU worker (started by WorkerSupervisor)")
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--target", default=HARNESS_TARGET)
    parser.add_argument("--options", default="{}")
    parser.add_argument("--parent", type=int, default=0, help="supervisor pid: exit when it is gone")
    args = parser.parse_args(argv)
    if args.parent:
        _exit_with_parent(args.parent)
    conn = Connection(args.fd)
    handler = load_target(args.target)(ast.literal_eval(args.options))
    return serve(conn, handler)


if __name__ == "__main__":
    sys.exit(main())
