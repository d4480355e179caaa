"""Run one compile in a disposable child process with a wall-clock deadline and a memory cap.

Why a child per compile: a compiler can hang (template or unroll bombs), eat all memory or
crash; none of that may take down the caller (the engine, a pool worker, a GPU worker).

How: the parent starts ``python <this file>`` (a fresh interpreter, never a fork, so it is safe
from a process that has initialised CUDA) in a new session, so the child leads its own process
group; it pickles the request to the child's stdin. The child sets ``RLIMIT_AS``, compiles with
NVRTC (in-process) or nvcc (a sub-process that inherits the cap and the group), and pickles
``(ok, cubin, log)`` to stdout (NVRTC is called through ``ctypes``: see ``_nvrtc_compile``). On overrun the parent kills the whole group, nvcc's cicc and
ptxas included. This file imports only the standard library (and ``cuda.bindings.nvrtc`` in
the child): starting the child costs ~0.1 s, not the ~0.4 s of importing our packages.
"""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ChildOutcome", "run_compile_isolated", "DEFAULT_MEM_MB"]

#: Address-space cap per compile. NVRTC needs ~0.4 GiB of virtual memory for a small kernel;
#: nvcc's cicc and ptxas each get the same cap.
DEFAULT_MEM_MB = 4096

_OOM_HINTS = ("out of memory", "bad_alloc", "memory allocation failure", "cannot allocate memory",
              "memoryerror", "insufficient memory", "std::length_error", "failed to map segment")


@dataclass(frozen=True)
class ChildOutcome:
    ok: bool
    cubin: bytes
    log: str
    seconds: float
    failure: str = ""  # "", "timeout", "oom", "crash": why there is no compiler verdict
    pid: int = 0       # the child's pid, also its process-group id


# -- parent side -----------------------------------------------------------------------------
def run_compile_isolated(backend: str, source: str, flags: tuple[str, ...], *, timeout_s: float,
                         mem_mb: int = DEFAULT_MEM_MB, nvcc: str | None = None,
                         library: str | None = None) -> ChildOutcome:
    """Compile in a child; never raises for compiler trouble, reports it in the outcome."""
    request = pickle.dumps({"backend": backend, "source": source, "flags": list(flags),
                            "mem_mb": mem_mb, "nvcc": nvcc, "library": library})
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(request, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return ChildOutcome(False, b"", f"timeout after {timeout_s:g}s ({backend})", time.monotonic() - t0,
                            "timeout", proc.pid)
    finally:
        if proc.returncode is None:  # an exception in this thread: leave nothing behind
            _kill_group(proc)
            proc.wait()
    seconds = time.monotonic() - t0
    try:
        ok, cubin, log = pickle.loads(out)
    except Exception:
        code = proc.returncode
        why = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        tail = err.decode(errors="replace")[-2000:].strip()
        if mem_mb > 0 and (code in (-signal.SIGABRT, -signal.SIGSEGV, -signal.SIGKILL)
                           or any(h in tail.lower() for h in _OOM_HINTS)):
            return ChildOutcome(False, b"", f"out of memory or crash: the {backend} compile died ({why}) "
                                f"under a {mem_mb} MiB address-space limit\n{tail}".strip(), seconds, "oom",
                                proc.pid)
        return ChildOutcome(False, b"", f"the {backend} compile child died ({why})\n{tail}".strip(), seconds,
                            "crash", proc.pid)
    if not ok and any(h in log.lower() for h in _OOM_HINTS):
        return ChildOutcome(False, b"", f"out of memory (limit {mem_mb} MiB):\n{log}", seconds, "oom", proc.pid)
    return ChildOutcome(bool(ok), bytes(cubin), str(log), seconds, "", proc.pid)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child's process group (it leads it: ``start_new_session``) while it is unreaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


# -- child side ------------------------------------------------------------------------------
def _nvrtc_compile(source: str, flags: list[str], library: str | None) -> tuple[bool, bytes, str]:
    """NVRTC through ``ctypes`` on the same ``libnvrtc`` that ``cuda.bindings`` loads.

    Why not ``cuda.bindings.nvrtc`` here: importing it costs ~0.1 s per child, half the cost
    of a small compile; the C API below is six calls. Without a library path (not found by the
    parent) we fall back to the bindings.
    """
    if library is None:
        return _nvrtc_compile_bindings(source, flags)
    import ctypes
    import glob

    for builtins in sorted(glob.glob(os.path.join(os.path.dirname(library), "libnvrtc-builtins.so*"))):
        if ".alt." not in builtins:  # libnvrtc dlopens it by soname; preload it from the same folder
            ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
            break
    lib = ctypes.CDLL(library)
    c_p, size_p = ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)
    lib.nvrtcCreateProgram.argtypes = [ctypes.POINTER(c_p), ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int,
                                       ctypes.c_void_p, ctypes.c_void_p]
    lib.nvrtcCompileProgram.argtypes = [c_p, ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
    for name in ("nvrtcGetProgramLogSize", "nvrtcGetCUBINSize"):
        getattr(lib, name).argtypes = [c_p, size_p]
    for name in ("nvrtcGetProgramLog", "nvrtcGetCUBIN"):
        getattr(lib, name).argtypes = [c_p, ctypes.c_char_p]
    lib.nvrtcDestroyProgram.argtypes = [ctypes.POINTER(c_p)]
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def check(code: int, what: str) -> None:
        if code != 0:
            raise RuntimeError(f"{what} failed: {lib.nvrtcGetErrorString(code).decode()}")

    prog = c_p()
    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"candidate.cu", 0, None, None),
          "nvrtcCreateProgram")
    try:
        opts = (ctypes.c_char_p * len(flags))(*(f.encode() for f in flags))
        res = lib.nvrtcCompileProgram(prog, len(flags), opts)
        size = ctypes.c_size_t()
        check(lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(size.value + 1)
        check(lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.value.decode(errors="replace").strip()
        if res != 0:
            return False, b"", f"{log}\n{lib.nvrtcGetErrorString(res).decode()}".strip()
        check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return True, cubin.raw, log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvrtc_compile_bindings(source: str, flags: list[str]) -> tuple[bool, bytes, str]:
    from cuda.bindings import nvrtc

    def check(result: tuple, what: str) -> tuple:
        if result[0] != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise RuntimeError(f"{what} failed: {result[0]!r}")
        return result

    _, prog = check(nvrtc.nvrtcCreateProgram(source.encode(), b"candidate.cu", 0, [], []), "nvrtcCreateProgram")
    try:
        opts = [f.encode() for f in flags]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        _, size = check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        buf = b" " * size
        check(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        log = buf.rstrip(b"\0 ").decode(errors="replace").strip()
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, b"", f"{log}\n{getattr(res, 'name', res)}".strip()
        _, size = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return True, bytes(cubin), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvcc_compile(source: str, flags: list[str], nvcc: str | None) -> tuple[bool, bytes, str]:
    if not nvcc:
        return False, b"", "nvcc not found (set CUDA_HOME or put nvcc on PATH)"
    with tempfile.TemporaryDirectory(prefix="evo-nvcc-") as tmp:
        src, out = Path(tmp) / "candidate.cu", Path(tmp) / "candidate.cubin"
        src.write_text(source)
        proc = subprocess.run([nvcc, "-cubin", *flags, "-o", str(out), str(src)], cwd=tmp,
                              capture_output=True, text=True)
        log = (proc.stdout + proc.stderr).replace(str(src), "candidate.cu").strip()
        if proc.returncode != 0 or not out.is_file():
            return False, b"", log or f"nvcc exited with {proc.returncode}"
        return True, out.read_bytes(), log


def _child_main() -> None:
    import resource

    req = pickle.loads(sys.stdin.buffer.read())
    if req["mem_mb"] > 0:
        limit = req["mem_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        if req["backend"] == "nvrtc":
            result = _nvrtc_compile(req["source"], req["flags"], req.get("library"))
        else:
            result = _nvcc_compile(req["source"], req["flags"], req["nvcc"])
    except MemoryError:
        result = (False, b"", "out of memory (MemoryError in the compile child)")
    except Exception as exc:  # report, never hang the parent
        result = (False, b"", f"compiler raised {type(exc).__name__}: {exc}")
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _child_main()
