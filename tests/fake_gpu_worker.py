"""Test double for the GPU worker's handler (a boundary we don't own: the GPU and its driver).

Started by the real ``WorkerSupervisor`` in a real process, it behaves as the job's ``fake``
field asks: ``ok``, ``segv`` (kills itself with SIGSEGV), ``hang`` (sleeps forever in the phase
named by ``phase``), ``exit`` (exits with ``code``), ``fatal`` (reports a context-poisoning
error), ``print`` (writes to stdout, which must land in the log, not the parent's stdout) and
``grandchild`` (starts a sleeping child process and hangs: the group kill must end both).
A job without a ``fake`` field takes it from the candidate's ``meta["fake"]`` (pool tests).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable

PHASES = ("load", "correctness", "timing")


class FakeGpuHandler:
    def __init__(self, options: dict) -> None:
        self.options = options
        if options.get("startup") == "hang":
            time.sleep(3600)
        if options.get("startup") == "exit" or (options.get("fail_gpu") is not None
                                                and options["fail_gpu"] == os.environ.get("CUDA_VISIBLE_DEVICES")):
            os._exit(5)

    def info(self) -> dict:
        return {"fake": True, "pid": os.getpid(), "arch": "sm_90a"}

    def handle(self, kind: str, job: dict, phase: Callable[[str], None]) -> dict:
        if kind == "probe":
            return {"status": "ok", "message": "fake probe"}
        behaviour = job.get("fake") or (job.get("meta") or {}).get("fake") or "ok"
        where = job.get("phase", "correctness")
        shapes = job.get("shapes", ["64x64x64:TN:f32"])
        done = [_ok(s) for s in shapes[:-1]]
        for r in done:  # every shape but the last finishes before the behaviour strikes
            phase("partial", r)
        for name in PHASES:
            phase(name)
            if name != where:
                continue
            if behaviour == "segv":
                os.kill(os.getpid(), signal.SIGSEGV)
            elif behaviour == "hang":
                time.sleep(3600)
            elif behaviour == "exit":
                sys.stdout.flush()
                os._exit(int(job.get("code", 3)))
            elif behaviour == "fatal":
                return {"status": "runtime_error", "message": "CUDA_ERROR_ILLEGAL_ADDRESS (fake)", "fatal": True}
            elif behaviour == "print":
                print("FAKE-WORKER-STDOUT", flush=True)
                print("FAKE-WORKER-STDERR", file=sys.stderr, flush=True)
            elif behaviour == "grandchild":
                child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
                with open(job["pidfile"], "w") as f:
                    f.write(str(child.pid))
                time.sleep(3600)
        return {"status": "ok", "message": "", "pid": os.getpid(), "shapes": done + [_ok(shapes[-1])]}


def _ok(shape: str) -> dict:
    return {"shape": shape, "status": "ok", "message": "", "timers": {}, "flags": [],
            "max_error": 0.0, "correctness_s": 0.01, "timing_s": 0.02}


def make_handler(options: dict) -> Any:
    return FakeGpuHandler(options)
