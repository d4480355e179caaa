"""Run one compile in a disposable child process with a wall-clock deadline and a memory cap.

Why a child per compile: a compiler can hang (template or unroll bombs), eat all memory or
crash; none of that may take down the caller (the engine, a pool worker, a GPU worker).

How: by default the child is forked from a warm fork server (:mod:`evaluators.compile._zygote`), else
(``$EVO_COMPILE_ZYGOTE=0``, or the server cannot start) the parent starts ``python <this
file>`` (a fresh interpreter, never a fork of the caller, so it is safe from a process that
has initialised CUDA) and pickles the request to its stdin. Either way the child leads its own
session and process group, sets ``RLIMIT_AS``, compiles with NVRTC (in-process, through
``ctypes``: see ``_nvrtc_compile``) or nvcc (a sub-process that inherits the cap and the
group) and returns ``(ok, cubin, log)``; on overrun the whole group is killed, nvcc's cicc and
ptxas included. This file imports only the standard library, so the child (and the fork
server, which imports it as a top-level module) never pays for importing our packages.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    from ._outcome import ChildOutcome, classify, timeout_outcome
    from ._ptxscan import REJECT_MARK, scan_ptx
    from ._sass import SassUnavailable, check_cubin
except ImportError:  # loaded as a top-level module (the compile child, the fork server)
    from _outcome import ChildOutcome, classify, timeout_outcome  # type: ignore[no-redef]
    from _ptxscan import REJECT_MARK, scan_ptx  # type: ignore[no-redef]
    from _sass import SassUnavailable, check_cubin  # type: ignore[no-redef]

__all__ = ["ChildOutcome", "run_compile_isolated", "DEFAULT_MEM_MB"]

#: Address-space cap per compile. NVRTC needs ~0.4 GiB of virtual memory for a small kernel;
#: nvcc's cicc and ptxas each get the same cap.
DEFAULT_MEM_MB = 4096
#: The cap of the one retry after a compile child died (twice the first cap, at most this).
RETRY_MEM_MB_MAX = 8192

# -- parent side -----------------------------------------------------------------------------
def run_compile_isolated(backend: str, source: str, flags: tuple[str, ...], *, timeout_s: float,
                         mem_mb: int = DEFAULT_MEM_MB, nvcc: str | None = None,
                         library: str | None = None, zygote: bool | None = None,
                         sass: tuple[str | None, str] | None = None,
                         retry_mem_mb: int | None = None) -> ChildOutcome:
    """Compile in a child; never raises for compiler trouble, reports it in the outcome.

    ``sass`` (``(nvdisasm path or None, arch)``): also judge the cubin's machine code
    (:mod:`evaluators.compile._sass`) in the child; a missing or failing disassembler is the
    failure ``"sass"`` (no verdict), never a pass.

    ``zygote`` (default: on unless ``$EVO_COMPILE_ZYGOTE=0``) forks the child from a warm fork
    server (:mod:`evaluators.compile._zygote`); otherwise, or when the server cannot start, a fresh
    interpreter is spawned per compile.

    A child that dies (a signal, or the compiler out of memory: ``failure`` "oom" or "crash") is
    compiled once more in a freshly spawned interpreter under ``retry_mem_mb`` (default twice the
    cap, at most :data:`RETRY_MEM_MB_MAX`), before the death counts against the candidate: an honest template
    kernel died so, once in 120, in every throughput run on an H100 and never here, whatever the
    cap (bench/RESULTS.md section 29). A kernel that kills the compiler on purpose costs two
    compiles and is still refused; a timeout is not retried (it already spent its deadline).
    """
    request = {"backend": backend, "source": source, "flags": list(flags), "mem_mb": mem_mb, "nvcc": nvcc,
               "library": library, "sass": list(sass) if sass is not None else None}
    if zygote is None:
        zygote = os.environ.get("EVO_COMPILE_ZYGOTE", "1") != "0"
    # nvcc's scratch folder belongs to the parent: a child killed at its deadline cannot clean up,
    # and its ~4 MB of intermediates per kill used to stay in the temporary folder for good
    scratch = tempfile.mkdtemp(prefix="evo-nvcc-") if backend == "nvcc" else None
    request["scratch"] = scratch
    try:
        first = None
        if zygote:
            from ._zygote import ZygoteUnavailable, zygote_for

            try:
                first = zygote_for(library, flags if backend == "nvrtc" else ()).compile(request, timeout_s)
            except ZygoteUnavailable:
                pass
        if first is None:
            first = _spawn_compile(request, timeout_s)
        if first.failure not in ("oom", "crash"):
            return first
        cap = retry_mem_mb if retry_mem_mb is not None else (min(2 * mem_mb, RETRY_MEM_MB_MAX) if mem_mb > 0 else 0)
        second = _spawn_compile(dict(request, mem_mb=cap), timeout_s)
        note = f"[compiled again in a fresh child under {cap} MiB after the first child died: {first.log[:300]}]"
        return dataclasses.replace(second, log=f"{second.log}\n{note}".strip(), retried=True)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _spawn_compile(request: dict, timeout_s: float) -> ChildOutcome:
    backend = request["backend"]
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(pickle.dumps(request), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return timeout_outcome(backend, timeout_s, time.monotonic() - t0, proc.pid)
    finally:
        if proc.returncode is None:  # an exception in this thread: leave nothing behind
            _kill_group(proc)
            proc.wait()
    return classify(out, proc.returncode, err, request, time.monotonic() - t0, proc.pid)


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Kill the child's process group (it leads it: ``start_new_session``) while it is unreaped."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()


# -- child side ------------------------------------------------------------------------------
_LIBS: dict[str, object] = {}


def _load_nvrtc(library: str):  # -> ctypes.CDLL, kept per process (a warm zygote loads it once)
    import ctypes
    import glob

    if library not in _LIBS:
        for builtins in sorted(glob.glob(os.path.join(os.path.dirname(library), "libnvrtc-builtins.so*"))):
            if ".alt." not in builtins:  # libnvrtc dlopens it by soname; preload it from the same folder
                ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
                break
        _LIBS[library] = ctypes.CDLL(library)
    return _LIBS[library]


def _nvrtc_compile(source: str, flags: list[str], library: str | None) -> tuple[bool, bytes, str, str]:
    """NVRTC through ``ctypes`` on the same ``libnvrtc`` that ``cuda.bindings`` loads.

    Why not ``cuda.bindings.nvrtc`` here: importing it costs ~0.1 s per child, half the cost
    of a small compile; the C API below is six calls. Without a library path (not found by the
    parent) we fall back to the bindings.
    """
    if library is None:
        return _nvrtc_compile_bindings(source, flags)
    import ctypes

    lib = _load_nvrtc(library)
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
    lib.nvrtcGetPTXSize.argtypes = [c_p, size_p]
    lib.nvrtcGetPTX.argtypes = [c_p, ctypes.c_char_p]

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
            return False, b"", f"{log}\n{lib.nvrtcGetErrorString(res).decode()}".strip(), ""
        check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        cubin = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
        ptx = ctypes.create_string_buffer(size.value + 1)
        check(lib.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return True, cubin.raw, log, ptx.value.decode(errors="replace")
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def _nvrtc_compile_bindings(source: str, flags: list[str]) -> tuple[bool, bytes, str, str]:
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
            return False, b"", f"{log}\n{getattr(res, 'name', res)}".strip(), ""
        _, size = check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = b" " * size
        check(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        _, size = check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * size
        check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return True, bytes(cubin), log, ptx.rstrip(b"\0").decode(errors="replace")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _nvcc_compile(source: str, flags: list[str], nvcc: str | None,
                  scratch: str | None = None) -> tuple[bool, bytes, str, str]:
    """nvcc to a cubin, keeping its intermediate files so that the PTX it assembled can be scanned;
    in ``scratch`` (the parent's folder, removed by the parent) when given."""
    if not nvcc:
        return False, b"", "nvcc not found (set CUDA_HOME or put nvcc on PATH)", ""
    with (contextlib.nullcontext(scratch) if scratch else tempfile.TemporaryDirectory(prefix="evo-nvcc-")) as tmp:
        src, out = Path(tmp) / "candidate.cu", Path(tmp) / "candidate.cubin"
        keep = Path(tmp) / "keep"
        keep.mkdir()
        src.write_text(source)
        proc = subprocess.run([nvcc, "-cubin", *flags, "--keep", "--keep-dir", str(keep), "-o", str(out), str(src)],
                              cwd=tmp, capture_output=True, text=True)
        log = (proc.stdout + proc.stderr).replace(str(src), "candidate.cu").strip()
        if proc.returncode != 0 or not out.is_file():
            return False, b"", log or f"nvcc exited with {proc.returncode}", ""
        ptx = "\n".join(p.read_text(errors="replace") for p in sorted(keep.glob("*.ptx")))
        return True, out.read_bytes(), log, ptx


def compile_request(req: dict) -> tuple[bool, bytes, str, dict]:
    """In the child: cap the address space, compile, scan the PTX the compiler produced
    (:func:`evaluators.compile._ptxscan.scan_ptx`; a refusal is a failed result whose log starts with
    ``REJECT_MARK``, no PTX at all is one too), then, where ``req["sass"]`` asks, judge the cubin's
    machine code (:func:`evaluators.compile._sass.check_cubin`: its refusals join the PTX scan's; the
    kernels that may wait on other CTAs go back in the facts, ``{"waits": {...}}``; no disassembler
    is ``{"unavailable": why}``), map exceptions to a failed result."""
    import resource

    if req["mem_mb"] > 0:
        limit = req["mem_mb"] * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        if req["backend"] == "nvrtc":
            ok, cubin, log, ptx = _nvrtc_compile(req["source"], req["flags"], req.get("library"))
        else:
            ok, cubin, log, ptx = _nvcc_compile(req["source"], req["flags"], req["nvcc"], req.get("scratch"))
        if not ok:
            return ok, cubin, log, {}
        reasons = scan_ptx(ptx) if ptx.strip() else ["the compiler produced no PTX to scan"]
        facts: dict = {}
        if req.get("sass") is not None:
            tool, arch = req["sass"]
            try:
                refused, waits = check_cubin(cubin, tool, arch)
            except SassUnavailable as exc:
                return False, b"", str(exc), {"unavailable": str(exc)}
            reasons += [r for r in refused if r not in reasons]
            facts["waits"] = waits
        if reasons:
            return False, b"", REJECT_MARK + "; ".join(reasons), {}
        return ok, cubin, log, facts
    except MemoryError:
        return (False, b"", "out of memory (MemoryError in the compile child)", {})
    except Exception as exc:  # report, never hang the parent
        return (False, b"", f"compiler raised {type(exc).__name__}: {exc}", {})


def _child_main() -> None:
    result = compile_request(pickle.loads(sys.stdin.buffer.read()))
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    _child_main()
