"""Where a measurement was taken: GPU, driver, CUDA, clocks, torch and evo versions.

NVML (``pynvml``, from nvidia-ml-py) gives the SM clock at measurement time in microseconds;
without it ``nvidia-smi`` is asked once and the clock is read at start-up only.
"""
from __future__ import annotations

import os
import subprocess
from functools import lru_cache
from typing import Any, Mapping, Optional

__all__ = ["code_version", "source_digest", "static_provenance", "sm_clock_mhz", "buffers_warning"]


def buffers_warning(provenance: Mapping[str, Any]) -> Optional[str]:
    """A one-line warning when the worker that measured a result checked it in plain allocations
    (its VA-reserved buffers were refused by the driver, or ``buffers = "torch"`` was asked for):
    a store far outside a buffer then lands in other memory instead of faulting, so the
    out-of-bounds checks are weaker. None when the buffers were VA-reserved (or not recorded)."""
    buffers = provenance.get("buffers")
    allocator = buffers.get("allocator") if isinstance(buffers, Mapping) else None
    if allocator is None or allocator == "vmm":
        return None
    return (f"the GPU worker checked candidates in plain allocations ({allocator}), not VA-reserved buffers: "
            "stores far outside a buffer are not sure to fault (see the worker log)")

_NVML: Any = None


def _nvml_handle() -> Any:
    global _NVML
    if _NVML is None:
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            index = int((os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0])
            _NVML = (pynvml, pynvml.nvmlDeviceGetHandleByIndex(index))
        except Exception:
            _NVML = False
    return _NVML


def sm_clock_mhz() -> Optional[int]:
    """The current SM clock (NVML), or None where NVML is not available."""
    h = _nvml_handle()
    if not h:
        return None
    try:
        return int(h[0].nvmlDeviceGetClockInfo(h[1], h[0].NVML_CLOCK_SM))
    except Exception:
        return None


@lru_cache(maxsize=1)
def code_version() -> str:
    """``git describe`` of the evo checkout (else the package version), then ``src`` and a digest
    of the measuring code's files (:func:`source_digest`).

    A ``-dirty`` describe says only that something changed, and a copied checkout can carry a
    stale ``.git`` (the device machine's copy of the working tree did: it described every tree
    of a session as the session's first commit); the digest tells the code that measured apart."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    described = ""
    try:
        out = subprocess.run(["git", "-C", root, "describe", "--always", "--dirty", "--tags"],
                             capture_output=True, text=True, timeout=5)
        if out.returncode == 0 and out.stdout.strip():
            described = out.stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        pass
    if not described:
        try:
            from importlib.metadata import version

            described = f"evo-hgemm {version('evo-hgemm')}"
        except Exception:
            described = "unknown"
    return f"{described} src {source_digest()}"


def source_digest(packages: tuple[str, ...] = ("evaluators", "populations"), root: Optional[str] = None) -> str:
    """12 hex digits of sha256 over the ``.py`` files (paths and bytes) of the packages that check
    and time kernels (under ``root``: by default the checkout this module is in)."""
    import hashlib

    root = root or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for pkg in packages:
        for dirpath, dirnames, filenames in os.walk(os.path.join(root, pkg)):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(f for f in filenames if f.endswith(".py")):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).replace(os.sep, "/").encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read() + b"\0")
    return h.hexdigest()[:12]


def static_provenance() -> dict[str, Any]:
    """What does not change while a worker lives (call inside the worker, after CUDA init)."""
    import torch

    info: dict[str, Any] = {"torch": torch.__version__, "cuda_runtime": torch.version.cuda, "evo": code_version()}
    props = torch.cuda.get_device_properties(0)
    info.update(gpu=props.name, sm_count=props.multi_processor_count, compute_capability=f"{props.major}.{props.minor}",
                l2_bytes=int(getattr(props, "L2_cache_size", 0) or 0), memory_bytes=int(props.total_memory))
    try:
        from cuda.bindings import driver

        err, ver = driver.cuDriverGetVersion()
        if int(err) == 0:
            info["cuda_driver_api"] = f"{ver // 1000}.{ver % 1000 // 10}"
    except Exception:
        pass
    h = _nvml_handle()
    if h:
        try:
            drv = h[0].nvmlSystemGetDriverVersion()
            info["driver"] = drv.decode() if isinstance(drv, bytes) else drv
            info["sm_clock_max_mhz"] = int(h[0].nvmlDeviceGetMaxClockInfo(h[1], h[0].NVML_CLOCK_SM))
        except Exception:
            pass
    else:
        try:
            out = subprocess.run(["nvidia-smi", "-i", (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0],
                                  "--query-gpu=driver_version,clocks.sm,clocks.max.sm", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True, timeout=20)
            drv, sm, smax = [x.strip() for x in out.stdout.strip().split(",")]
            info.update(driver=drv, sm_clock_startup_mhz=int(sm), sm_clock_max_mhz=int(smax))
        except Exception:
            pass
    return info
