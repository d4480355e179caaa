"""Shared pytest set-up: GPU tests are skipped, with the reason, where no NVIDIA GPU is usable."""
from __future__ import annotations

import functools
import shutil
import subprocess

import pytest


@functools.lru_cache(maxsize=1)
def gpu_reason() -> str | None:
    """None when a CUDA GPU is usable here, else why not."""
    if shutil.which("nvidia-smi") is None:
        return "no NVIDIA GPU on this machine (nvidia-smi not found)"
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi failed: {exc}"
    if out.returncode != 0 or "GPU" not in out.stdout:
        return "nvidia-smi lists no GPU"
    try:
        import torch  # noqa: F401  (the GPU harness needs torch)
    except ImportError:
        return "torch is not installed (GPU tests need the gpu extra)"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not any("gpu" in item.keywords for item in items):
        return
    reason = gpu_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test: {reason}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
