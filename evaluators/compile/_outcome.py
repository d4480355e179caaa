"""A compile child's outcome, read by the parent whichever way the child was started (spawned
by ``_isolate``, forked by the ``_zygote`` fork server): both import it from here, so neither
needs the other. Standard library only: the child loads this folder's modules as top-level ones.
"""
from __future__ import annotations

import pickle
import signal
from dataclasses import dataclass

__all__ = ["ChildOutcome", "classify", "timeout_outcome"]

_OOM_HINTS = ("out of memory", "bad_alloc", "memory allocation failure", "cannot allocate memory",
              "memoryerror", "insufficient memory", "std::length_error", "failed to map segment")


@dataclass(frozen=True)
class ChildOutcome:
    ok: bool
    cubin: bytes
    log: str
    seconds: float
    failure: str = ""  # "", "timeout", "oom", "crash", "sass": why there is no compiler verdict
    pid: int = 0       # the child's pid, also its process-group id
    waits: tuple[tuple[str, str], ...] = ()  # (kernel, why) for kernels that may wait on other CTAs (_sass)
    retried: bool = False  # a second child compiled it after the first died (_isolate.run_compile_isolated)


def timeout_outcome(backend: str, timeout_s: float, seconds: float, pid: int) -> ChildOutcome:
    return ChildOutcome(False, b"", f"timeout after {timeout_s:g}s ({backend})", seconds, "timeout", pid)


def classify(out: bytes, returncode: int, err: bytes, request: dict, seconds: float, pid: int) -> ChildOutcome:
    """Turn a finished child's pickled result (or its death) into an outcome."""
    backend, mem_mb = request["backend"], request["mem_mb"]
    try:
        ok, cubin, log, *rest = pickle.loads(out)
        facts = rest[0] if rest else {}
    except Exception:
        code = returncode
        why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        tail = err.decode(errors="replace")[-2000:].strip()
        if mem_mb > 0 and (code in (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGKILL)
                           or any(h in tail.lower() for h in _OOM_HINTS)):
            return ChildOutcome(False, b"", f"out of memory or crash: the {backend} compile died ({why}) "
                                f"under a {mem_mb} MiB address-space limit\n{tail}".strip(), seconds, "oom", pid)
        return ChildOutcome(False, b"", f"the {backend} compile child died ({why})\n{tail}".strip(), seconds,
                            "crash", pid)
    if not ok and any(h in log.lower() for h in _OOM_HINTS):
        return ChildOutcome(False, b"", f"out of memory (limit {mem_mb} MiB):\n{log}", seconds, "oom", pid)
    if facts.get("unavailable"):
        return ChildOutcome(False, b"", f"the machine-code check could not run: {facts['unavailable']}", seconds,
                            "sass", pid)
    return ChildOutcome(bool(ok), bytes(cubin), str(log), seconds, "", pid,
                        tuple(sorted(dict(facts.get("waits", {})).items())))
