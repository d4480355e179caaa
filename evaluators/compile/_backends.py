"""Compiler flags for the two back ends. Flags are part of the cache key, so order is fixed.

The compile itself runs in :mod:`evaluators.compile._isolate`'s child process.
"""
from __future__ import annotations

from ._toolkit import include_dirs

__all__ = ["nvrtc_flags", "nvcc_flags", "flags_for"]


def nvrtc_flags(arch: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """NVRTC: cubin for ``arch``, C++17, undecorated functions are device functions, ptxas stats.

    No ``--use_fast_math``: it changes division/exp accuracy and denormals, so a candidate could
    pass or fail correctness for reasons that are not its own.
    """
    return (
        f"--gpu-architecture={arch}",
        "-std=c++17",
        "-default-device",
        "--ptxas-options=-v",
        *(f"-I{d}" for d in include_dirs()),
        *extra,
    )


def nvcc_flags(arch: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    """nvcc: ``sm_90a`` -> ``-gencode=arch=compute_90a,code=sm_90a`` (same for ``sm_80``)."""
    num = arch.removeprefix("sm_")
    return (f"-gencode=arch=compute_{num},code=sm_{num}", "-std=c++17", "-Xptxas", "-v", *extra)


def flags_for(backend: str, arch: str, extra: tuple[str, ...] = ()) -> tuple[str, ...]:
    return nvrtc_flags(arch, extra) if backend == "nvrtc" else nvcc_flags(arch, extra)
