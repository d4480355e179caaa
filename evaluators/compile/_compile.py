"""``compile_candidate``: static scan, cache, isolated compile, ptxas stats, resource policy.

The compile step of the evaluation cascade (docs/design.md, section 4). Everything here runs
on CPUs and never touches a GPU. Statuses (``populations.Status``):

- ``REJECTED``: the static scan refused the source or plan, the compiled-output scan refused
  what the compiler produced (in the compile child: :mod:`evaluators.compile._ptxscan` on the PTX,
  then :mod:`evaluators.compile._sass` on the cubin's machine code: time sources, launch identity,
  writable module state, calls out of the module), or the candidate needs sm_90a
  (tensor maps, or ``meta["arch_features"]`` naming ``sm_90a``) and the target is ``sm_80``.
- ``COMPILE_ERROR``: the compiler said no (the log is the message), the compile ran past its
  deadline ("timeout after Xs") or its memory cap ("out of memory ..."), or the cubin breaks
  the resource policy: more than 16 KiB of stack/local memory per thread, static plus dynamic
  shared memory above the arch's per-block limit, or more than 64 Ki registers per block. Also
  when the machine code cannot be judged (no ``nvdisasm``, or it failed): fails closed, not cached.
- ``OK``: ``cubin`` and per-kernel ``KernelStats`` (registers, spills, smem, stack, cmem), and
  ``waits_on_ctas``: the kernels whose machine code may wait on other CTAs (the GPU worker checks
  their grid's residency whether or not the plan declares ``coresident``).

Compiler verdicts (success or a compile error) are cached on disk (:mod:`evaluators.compile._cache`);
timeouts and memory failures are not. The resource policy runs on every call, cached or not,
so changing it needs no cache flush. ``telemetry`` carries the scan's telemetry (``scan``),
the original compile seconds (``compile_s``) and, for failures without a compiler verdict,
``failure`` ("timeout", "oom", "crash") and ``child_pid`` (the killed process group).
Back end: ``backend=`` or ``$EVO_COMPILE_BACKEND``, else NVRTC where importable, else nvcc.
Isolation: :mod:`evaluators.compile._isolate` (``$EVO_COMPILE_ZYGOTE=0`` spawns instead of forking
from the warm server).
"""
from __future__ import annotations

import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Mapping

from populations import Candidate, KernelStats, PlanError, Shape, Status

from ._cache import CacheEntry, CubinCache, cache_key
from ._backends import flags_for
from ._isolate import DEFAULT_MEM_MB, run_compile_isolated
from ._ptxas import parse_ptxas, resource_problems
from ._ptxscan import PTX_SCAN_VERSION, REJECT_MARK
from ._sass import SASS_CHECK_VERSION
from ..static import ScanResult, scan, smoke_shapes
from ._toolkit import BACKENDS, cuda_tool, nvcc_path, nvrtc_available, nvrtc_library, toolkit_version

__all__ = ["CompileResult", "compile_candidate", "arch_for_capability", "default_backend",
           "ARCHS", "MAX_SMEM_PER_BLOCK", "sm90_requirements"]

ARCHS = ("sm_80", "sm_90a")
#: Largest static + dynamic shared memory per block (opt-in maximum): A100 163 KiB, H100/H200 227 KiB.
MAX_SMEM_PER_BLOCK = {"sm_80": 166912, "sm_90a": 232448}
MAX_REGS_PER_BLOCK = 65536


@dataclass(frozen=True)
class CompileResult:
    ok: bool
    status: Status
    message: str
    cubin: bytes = b""
    kernels: tuple[KernelStats, ...] = ()
    seconds: float = 0.0
    cached: bool = False
    backend: str = ""
    arch: str = ""
    telemetry: Mapping[str, Any] = field(default_factory=dict)
    waits_on_ctas: Mapping[str, str] = field(default_factory=dict)  # kernel -> why (the machine code's loops)


def arch_for_capability(capability: tuple[int, int]) -> str:
    """(9, 0) -> "sm_90a" (Hopper, arch-specific features on); (8, x) -> "sm_80".

    Newer majors are not targeted yet: sm_90a cubins do not run on them, so refuse clearly.
    """
    major, _minor = capability
    if major == 9:
        return "sm_90a"
    if major == 8:
        return "sm_80"
    raise ValueError(f"compute capability {major}.{_minor} is not a target of evo (sm_80 or sm_90a)")


def default_backend() -> str:
    """``$EVO_COMPILE_BACKEND`` if set, else NVRTC where importable, else nvcc."""
    env = os.environ.get("EVO_COMPILE_BACKEND")
    if env:
        return env
    return "nvrtc" if nvrtc_available() else "nvcc"


def sm90_requirements(candidate: Candidate) -> list[str]:
    """Why a candidate can only run on sm_90a (empty when it may target sm_80)."""
    why = []
    if candidate.plan.tensor_maps:
        why.append("its plan uses TMA tensor maps")
    feats = candidate.meta.get("arch_features") if isinstance(candidate.meta, Mapping) else None
    if feats and "sm_90a" in feats:
        why.append("it declares arch_features ['sm_90a']")
    return why


_SM90_HINT = re.compile(r"not supported on \.target|requires \.target sm_90|sm_90a")


def compile_candidate(candidate: Candidate, arch: str, *, timeout_s: float = 60, cache_dir: Any = None,
                      backend: str | None = None, mem_mb: int = DEFAULT_MEM_MB,
                      extra_flags: tuple[str, ...] = (), use_cache: bool = True,
                      run_scan: bool = True) -> CompileResult:
    """Scan, then compile ``candidate`` for ``arch`` ("sm_80" or "sm_90a"); never raises for bad code."""
    t0 = time.monotonic()
    backend = backend or default_backend()
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")

    def result(status: Status, message: str, **kw: Any) -> CompileResult:
        return CompileResult(ok=status is Status.OK, status=status, message=message,
                             seconds=time.monotonic() - t0, backend=backend, arch=arch, **kw)

    telemetry: dict[str, Any] = {}
    if run_scan:
        verdict = _memo_scan(candidate, arch)
        telemetry["scan"] = dict(verdict.telemetry)
        if not verdict.ok:
            return result(Status.REJECTED, "static scan: " + "; ".join(verdict.reasons), telemetry=telemetry)
    if arch == "sm_80" and (why := sm90_requirements(candidate)):
        return result(Status.REJECTED, f"needs sm_90a ({', '.join(why)}); the target is sm_80", telemetry=telemetry)

    flags = flags_for(backend, arch, tuple(extra_flags))
    cache = CubinCache(cache_dir) if use_cache else None
    key = cache_key(candidate.source, flags + (PTX_SCAN_VERSION, SASS_CHECK_VERSION), arch, backend,
                    toolkit_version(backend))
    entry = cache.get(key) if cache is not None else None
    cached = entry is not None
    if entry is None:
        out = run_compile_isolated(backend, candidate.source, flags, timeout_s=timeout_s, mem_mb=mem_mb,
                                   nvcc=nvcc_path() if backend == "nvcc" else None,
                                   library=nvrtc_library() if backend == "nvrtc" else None,
                                   sass=(cuda_tool("nvdisasm"), arch))
        if out.retried:
            telemetry["retried"] = True
        if out.failure:
            return result(Status.COMPILE_ERROR, out.log, telemetry={**telemetry, "failure": out.failure,
                                                                        "child_pid": out.pid})
        entry = CacheEntry(out.ok, out.cubin, out.log, out.seconds, out.waits)
        if cache is not None:
            cache.put(key, entry)
    telemetry["compile_s"] = entry.seconds
    if not entry.ok and entry.log.startswith(REJECT_MARK):  # the compiled-output scan (cached like a verdict)
        return result(Status.REJECTED, "compiled-output scan: " + entry.log[len(REJECT_MARK):], cached=cached,
                      telemetry=telemetry)
    if not entry.ok:
        msg = entry.log
        uses = telemetry.get("scan", {}).get("sm90_features")
        if arch == "sm_80" and uses and _SM90_HINT.search(msg):
            msg = f"candidate uses sm_90a features ({', '.join(uses)}) not available on sm_80:\n{msg}"
        return result(Status.COMPILE_ERROR, msg, cached=cached, telemetry=telemetry)

    report = parse_ptxas(entry.log)
    problems = resource_problems(report) + _launch_problems(candidate, report.kernels, arch)
    if problems:
        return result(Status.COMPILE_ERROR, "resource policy: " + "; ".join(problems),
                      kernels=report.kernels, cached=cached, telemetry=telemetry)
    return result(Status.OK, entry.log, cubin=entry.cubin, kernels=report.kernels, cached=cached,
                  telemetry=telemetry, waits_on_ctas=dict(entry.waits))


_SCANS: dict[tuple[str, str], ScanResult] = {}
_SCANS_LOCK = threading.Lock()
_SCANS_MAX = 4096


def _memo_scan(candidate: Candidate, arch: str) -> ScanResult:
    """The scan is most of a cache hit's cost (~0.05 s for a 400-line template); a candidate's
    id covers everything it reads (source, plan, shapes, generic), so verdicts are kept per
    process, the oldest dropped first."""
    key = (candidate.id, arch)
    with _SCANS_LOCK:
        hit = _SCANS.get(key)
    if hit is not None:
        return hit
    verdict = scan(candidate, arch=arch)
    with _SCANS_LOCK:
        if len(_SCANS) >= _SCANS_MAX:
            _SCANS.pop(next(iter(_SCANS)))
        _SCANS[key] = verdict
    return verdict


def _launch_problems(candidate: Candidate, kernels: tuple[KernelStats, ...], arch: str) -> list[str]:
    """Launches that could never start: too much shared memory or too many registers per block."""
    stats = {k.name: k for k in kernels}
    limit = MAX_SMEM_PER_BLOCK[arch]
    problems: list[str] = []
    shapes: tuple[Shape, ...] = candidate.shapes + (smoke_shapes(candidate) if candidate.generic else ())
    for launch in candidate.plan.launches:
        k = stats.get(launch.kernel)
        if k is None:
            problems.append(f"kernel {launch.kernel} is not in the cubin")
            continue
        threads = launch.block[0] * launch.block[1] * launch.block[2]
        if k.registers * threads > MAX_REGS_PER_BLOCK:
            problems.append(f"kernel {launch.kernel}: {k.registers} registers x {threads} threads exceeds "
                            f"{MAX_REGS_PER_BLOCK} registers per block")
    for shape in shapes:
        try:
            resolved, _ = candidate.plan.resolve(shape)
        except PlanError:
            continue  # the static scan reports plan errors
        for r in resolved:
            k = stats.get(r.kernel)
            if k is not None and k.smem_static + r.smem > limit:
                problems.append(f"kernel {r.kernel} at {shape}: {k.smem_static} B static + {r.smem} B dynamic "
                                f"shared memory exceeds {limit} B on {arch}")
    return list(dict.fromkeys(problems))
