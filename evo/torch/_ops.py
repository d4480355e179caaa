"""Build, load and fill the native operators ``torch.ops.evo_native.mm`` / ``.linear``.

The C++ source ships with the package (``evo_ops.cpp``); :func:`load_ops` compiles it on first
use with the user's C++ compiler (``$CXX``, else ``c++``) against the torch that is imported,
with torch's CUDA headers when torch has CUDA, and caches the shared object under
``$EVO_TORCH_OPS_CACHE`` (else ``$XDG_CACHE_HOME/evo/torch_ops``, else ``~/.cache/evo/torch_ops``),
keyed by the source, torch's version, its CUDA version and the compiler, so a new torch gets
a new build and nothing stale is ever loaded. No ninja, no setuptools: one compiler call.

:func:`register` fills the operator's dispatch table from an exported library: the address of
each exported C launcher (the ``evo_hgemm_<key>`` symbols of ``libevo_hgemm.so``, found through
ctypes) under its (M, N, K, layout), and beside a TN kernel that stages B its launcher for a
weight padded once (``evo_hgemm_<key>_wb``, which ``linear_prepared`` calls). Only shapes the export sent to an evolved kernel are in a
library's manifest, so the table never holds a kernel slower than cuBLAS.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Optional

__all__ = ["OpsBuildError", "SOURCE", "cache_dir", "build_command", "load_ops", "register", "registered",
           "call_counts", "reset_counts"]

SOURCE = Path(__file__).with_name("evo_ops.cpp")
_LOCK = threading.Lock()
_LOADED: Optional[Path] = None
_REGISTERED: Any = None  # the EvoLibrary whose launchers are in the table (keeps its .so loaded)


class OpsBuildError(RuntimeError):
    """The native operators could not be compiled or loaded here; the message says why."""


def cache_dir() -> Path:
    env = os.environ.get("EVO_TORCH_OPS_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "evo" / "torch_ops"


def _include_paths(cuda: bool) -> list[str]:
    """torch's headers, and with ``cuda`` the CUDA toolkit's (torch's CUDA_HOME, else
    $CUDA_HOME / $CUDA_PATH, else /usr/local/cuda)."""
    from torch.utils import cpp_extension

    paths = list(cpp_extension.include_paths())
    if cuda:
        home = cpp_extension.CUDA_HOME or os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
        if not (Path(home) / "include" / "cuda_runtime_api.h").is_file():
            raise OpsBuildError(f"torch has CUDA but the CUDA toolkit's headers are not under {home} (set $CUDA_HOME)")
        paths.append(str(Path(home) / "include"))
    return paths


def build_command(out: Path, *, cuda: Optional[bool] = None) -> list[str]:
    """The compiler call that builds ``out`` from :data:`SOURCE` for the imported torch."""
    import torch
    from torch.utils import cpp_extension

    if cuda is None:
        cuda = torch.version.cuda is not None
    cxx = shlex.split(os.environ.get("CXX", "c++"))
    lib = cpp_extension.library_paths()[0]
    cmd = [*cxx, "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
           f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"]
    if cuda:
        cmd.append("-DEVO_WITH_CUDA")
    cmd += [f"-I{p}" for p in _include_paths(cuda)]
    cmd += [str(SOURCE), "-o", str(out), f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch", "-ltorch_cpu"]
    if cuda:
        cmd += ["-lc10_cuda", "-ltorch_cuda"]
    return cmd


def _digest(cmd: list[str]) -> str:
    import torch

    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(f"{torch.__version__}|{torch.version.cuda}|{sys.version_info[:2]}".encode())
    h.update(" ".join(c for c in cmd if c != str(SOURCE) and not c.startswith("/tmp")).encode())
    try:
        h.update(subprocess.run([cmd[0], "--version"], capture_output=True, text=True, timeout=30).stdout.encode())
    except (OSError, subprocess.TimeoutExpired):
        pass
    return h.hexdigest()[:16]


def load_ops(*, cuda: Optional[bool] = None, timeout_s: float = 600.0) -> Path:
    """Build (once, cached) and load the native operators into this process; returns the .so.

    Raises :class:`OpsBuildError` when torch is missing, no compiler runs or the build fails."""
    global _LOADED
    with _LOCK:
        if _LOADED is not None:
            return _LOADED
        try:
            import torch
        except ImportError:
            raise OpsBuildError("torch is not installed") from None
        probe = build_command(Path("/tmp/x.so"), cuda=cuda)
        if shutil.which(probe[0]) is None:
            raise OpsBuildError(f"no C++ compiler: {probe[0]!r} not found (set $CXX)")
        so = cache_dir() / _digest(probe) / "evo_ops.so"
        if not so.is_file():
            so.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".evo_ops.", suffix=".so", dir=so.parent)
            os.close(fd)
            try:
                out = subprocess.run(build_command(Path(tmp), cuda=cuda), capture_output=True, text=True,
                                     timeout=timeout_s)
                if out.returncode:
                    err = next((ln for ln in out.stderr.splitlines() if "error" in ln), out.stderr.strip()[-400:])
                    raise OpsBuildError(f"building {SOURCE.name} failed: {err}")
                os.replace(tmp, so)  # whole or not at all: a concurrent build loads one or the other
            except subprocess.TimeoutExpired:
                raise OpsBuildError(f"building {SOURCE.name} took more than {timeout_s:.0f} s") from None
            finally:
                Path(tmp).unlink(missing_ok=True)
        torch.ops.load_library(str(so))
        _LOADED = so
        return so


def register(library: Any) -> int:
    """Put ``library``'s exported launchers (an :class:`evo.export._export.EvoLibrary`) in the operator's
    table, replacing what was there; returns how many. A library not active here (no GPU, other
    architecture) registers nothing: every call is then the cuBLAS fallback."""
    global _REGISTERED
    import torch

    load_ops()
    ops = torch.ops.evo_native
    with _LOCK:
        ops.clear_kernels()
        _REGISTERED = library
        if not getattr(library, "active", False):
            return 0
        for key in sorted(library.kernels):
            fn, workspace = library.launcher(key)
            m, n, k, layout = key
            ops.register_kernel(m, n, k, layout, ctypes.cast(fn, ctypes.c_void_p).value, workspace)
            prepared = library.prepared_launcher(key) if layout == "TN" else None
            if prepared is not None:  # the launcher for a weight padded once (linear_prepared)
                ops.register_prepared(m, n, k, ctypes.cast(prepared, ctypes.c_void_p).value)
        return int(ops.kernel_count())


def registered() -> Any:
    """The library :func:`register` last filled the table from (None before)."""
    return _REGISTERED


def call_counts() -> tuple[int, int]:
    """(evolved, fallback): CUDA calls of the operators that ran an exported kernel, and that fell
    back to cuBLAS, since :func:`reset_counts`. Counted when a call is made on the host, so the
    counts taken around a CUDA graph's capture say what the graph holds (replays add nothing)."""
    import torch

    load_ops()
    evolved, fallback = torch.ops.evo_native.call_counts()
    return int(evolved), int(fallback)


def reset_counts() -> None:
    """Set :func:`call_counts` back to (0, 0)."""
    import torch

    load_ops()
    torch.ops.evo_native.reset_counts()
