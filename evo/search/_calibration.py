"""The archive's calibration: measured once per device, cached, stored beside the archive.

:func:`ensure_calibration` (``evo run`` calls it before it starts the evaluator pool) returns the
calibration for this machine's GPU and writes it to ``ARCHIVE/calibration.json``:

1. the archive's own file, when it was measured on a GPU of the same name (and after the SM copy
   kernel replaced the memcpy in ``copy_bw``: older files, ``notes["copy_kernel"]`` missing, are
   measured again where a GPU is present);
2. else the per-device cache (``$EVO_CALIBRATION_DIR`` or ``~/.cache/evo/calibration/<gpu>.json``);
3. else a fresh measurement by ``python -m evaluators.run._calibrate`` in a child process (about
   10 s; this process never initialises CUDA, so compile children can still be forked), which
   also fills the cache;
4. else (no GPU, or measuring failed) the documented H200 figures, not written anywhere, so
   that a later run on a GPU measures.

:func:`load_calibration` only reads (inspect, report, the engine): the archive's file, else the
defaults.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Optional, Union

from populations import (CALIBRATION_FILE, H200_DEFAULTS, Calibration, read_calibration, roofline_frac,
                         write_calibration)

__all__ = ["ensure_calibration", "load_calibration", "current", "device_name", "cache_path", "evaluation_roofline"]

REPO = Path(__file__).resolve().parents[2]  # the checkout: evo/<wing>/ is two folders down


def device_name(gpu: int = 0) -> Optional[str]:
    """The GPU's name as nvidia-smi gives it (torch reports the same string), or None."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        return names[gpu] if out.returncode == 0 and len(names) > gpu else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def cache_path(name: str) -> Path:
    """Where the calibration of the GPU called ``name`` is cached on this machine."""
    root = Path(os.environ.get("EVO_CALIBRATION_DIR") or Path.home() / ".cache" / "evo" / "calibration")
    return root / (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") + ".json")


def current(cal: Calibration) -> bool:
    """Whether ``cal`` was measured the current way: its ``copy_bw`` from the SM copy kernel, not
    from a memcpy graph node (which may run on a copy engine: 2.71 TB/s on an H200 whose SMs copy
    about 4.3). The defaults count as current; they are never cached."""
    return cal.source == "default" or cal.notes.get("copy_kernel") == "sm"


def load_calibration(archive_dir: Union[str, os.PathLike, None]) -> Calibration:
    """The calibration stored with the archive, else the documented H200 defaults."""
    if archive_dir is None:
        return H200_DEFAULTS
    return read_calibration(archive_dir) or H200_DEFAULTS


def _measure(timeout_s: float) -> Calibration:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-m", "evaluators.run._calibrate"], capture_output=True, text=True,
                         timeout=timeout_s, env=env, cwd=str(REPO))
    if out.returncode != 0:
        tail = (out.stderr or out.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"exit {out.returncode}: {tail[0][:200]}")
    return Calibration.from_dict(json.loads(out.stdout.strip().splitlines()[-1]))


def ensure_calibration(archive_dir: Union[str, os.PathLike], *, measure: bool = True, timeout_s: float = 180.0,
                       log: Callable[[str], None] = lambda msg: None,
                       name_of: Callable[[], Optional[str]] = device_name,
                       measurer: Optional[Callable[[float], Calibration]] = None) -> Calibration:
    """See the module docstring. ``name_of`` and ``measurer`` are seams for tests (no GPU here)."""
    archive_dir = Path(archive_dir)
    name = name_of()
    here = read_calibration(archive_dir)
    if here is not None and here.source != "default" and (name is None or (here.device == name and current(here))):
        return here
    if name is None:
        return here or H200_DEFAULTS
    cached = read_calibration(cache_path(name))
    if cached is not None and cached.device == name and cached.source != "default" and current(cached):
        cal = cached.with_source("cached")
    elif measure:
        try:
            cal = (measurer or _measure)(timeout_s)
            log(f"evo: calibrated {cal.device}: {cal.peak_flops / 1e12:.0f} TFLOP/s, read {cal.read_bw / 1e12:.2f} TB/s, "
                f"copy {cal.copy_bw / 1e12:.2f} TB/s, launch floor {cal.launch_floor_s * 1e6:.2f} us")
            try:
                write_calibration(cache_path(name), cal)
            except OSError:
                pass  # a read-only home: the archive still gets its copy
        except (OSError, ValueError, KeyError, RuntimeError, subprocess.TimeoutExpired) as exc:
            log(f"evo: calibration failed ({type(exc).__name__}: {exc}); using the documented H200 figures")
            return H200_DEFAULTS
    else:
        return here or H200_DEFAULTS
    if archive_dir.is_dir():  # an opened archive; a new file in a missing one would make it "not empty"
        try:
            write_calibration(archive_dir / CALIBRATION_FILE, cal)
        except OSError:
            pass
    return cal


def evaluation_roofline(ev: Any, cal: Calibration) -> Optional[float]:
    """An evaluation's roofline fraction: the recorded one, else (archives from before issue 26)
    its device-timer median against ``cal`` (None without a device timer)."""
    if getattr(ev, "roofline_frac", None) is not None:
        return ev.roofline_frac
    t = ev.timers.get("device")
    return roofline_frac(ev.shape, t.median, cal) if t is not None else None
