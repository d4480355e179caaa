"""Where the CUDA toolkit is, which back ends exist, and their versions (for cache keys).

Search order for headers: ``$CUDA_HOME``, ``$CUDA_PATH``, ``/usr/local/cuda``, then the
``nvidia`` pip wheels' include folders (``nvidia/cu13/include`` and friends). A folder counts
when it holds ``cuda_fp16.h``; its ``cccl`` sub-folder is added when present.
"""
from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

__all__ = ["cuda_home", "include_dirs", "nvcc_path", "nvrtc_available", "nvrtc_library", "toolkit_version",
           "cuda_tool", "BACKENDS"]

BACKENDS = ("nvrtc", "nvcc")


def _candidates() -> list[Path]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    out = [Path(r) for r in roots if r]
    try:
        import nvidia  # type: ignore[import-not-found]

        for base in getattr(nvidia, "__path__", []):
            for sub in ("cu13", "cu12", "cuda_runtime", "cuda_nvrtc", "cuda_nvcc", "cuda_nvdisasm", "cuda_cuobjdump"):
                out.append(Path(base) / sub)
    except ImportError:
        pass
    return out


@functools.lru_cache(maxsize=1)
def cuda_home() -> Path | None:
    """The first toolkit root whose ``include`` holds ``cuda_fp16.h``."""
    for root in _candidates():
        if (root / "include" / "cuda_fp16.h").is_file():
            return root
    return None


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """``-I`` folders for device compiles: the toolkit include and its ``cccl``."""
    home = cuda_home()
    if home is None:
        return ()
    inc = home / "include"
    return tuple(str(p) for p in (inc, inc / "cccl") if p.is_dir())


@functools.lru_cache(maxsize=1)
def nvcc_path() -> str | None:
    home = cuda_home()
    if home is not None and (home / "bin" / "nvcc").is_file():
        return str(home / "bin" / "nvcc")
    return shutil.which("nvcc")


@functools.lru_cache(maxsize=4)
def cuda_tool(name: str) -> str | None:
    """The path of a toolkit binary (``nvdisasm``, ``cuobjdump``...), or None where there is none.

    Looked up in every toolkit root of :func:`_candidates` (``$CUDA_HOME``, ``/usr/local/cuda``, the
    ``nvidia`` wheels: ``nvidia-cuda-nvdisasm`` puts it in ``nvidia/cu13/bin``), then on ``PATH``. The
    one finder for the evaluator's SASS check and the tests that read SASS. ``cuobjdump`` counts only
    with an ``nvdisasm`` beside it or on ``PATH`` (it runs nvdisasm to print SASS).
    """
    for root in _candidates():
        path = root / "bin" / name
        if path.is_file() and os.access(path, os.X_OK):
            if name != "cuobjdump" or (root / "bin" / "nvdisasm").is_file() or shutil.which("nvdisasm"):
                return str(path)
    found = shutil.which(name)
    return found if found and (name != "cuobjdump" or shutil.which("nvdisasm")) else None


@functools.lru_cache(maxsize=1)
def nvrtc_available() -> bool:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except Exception:  # ImportError, or a broken shared library
        return False
    return True


@functools.lru_cache(maxsize=1)
def nvrtc_library() -> str | None:
    """Absolute path of the ``libnvrtc`` that ``cuda.bindings`` uses (found by ``cuda.pathfinder``)."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib  # type: ignore[import-not-found]

        path = load_nvidia_dynamic_lib("nvrtc").abs_path
        if path and os.path.isfile(path):
            return str(path)
    except Exception:
        pass
    home = cuda_home()
    for folder in ([home / "lib64", home / "lib"] if home else []):
        hits = sorted(folder.glob("libnvrtc.so*"))
        if hits:
            return str(hits[0])
    return None


@functools.lru_cache(maxsize=4)
def toolkit_version(backend: str) -> str:
    """A string that changes whenever the compiler that would run changes."""
    if backend == "nvrtc":
        from cuda.bindings import nvrtc

        err, major, minor = nvrtc.nvrtcVersion()
        import cuda.bindings

        return f"nvrtc {major}.{minor} bindings {getattr(cuda.bindings, '__version__', '?')} lib {nvrtc_library()}"
    if backend == "nvcc":
        path = nvcc_path()
        if path is None:
            return "nvcc missing"
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
        lines = [ln for ln in out.stdout.splitlines() if ln.strip()]
        return "nvcc " + " | ".join(lines[-2:])
    raise ValueError(f"unknown backend {backend!r}; use one of {BACKENDS}")
