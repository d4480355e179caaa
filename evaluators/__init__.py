"""Evaluators: static scan, compile pool, GPU workers, correctness and timing.

Imports only ``populations``. Keep this file a plain list of re-exports.

Subpackages by concern: ``static`` (source scan), ``compile`` (compile child, cache, pool),
``run`` (GPU worker, harness, loaders, timers), ``correctness`` (the cascade, worker-side),
``pools`` (``LocalPool``, ``RayPool``). The contract between pool and worker, ``Job`` and
``Result``, and the code provenance sit at the top.
"""
from ._job import JOB_OPTIONS, EliteThreshold, Job, Result, ShapeDraft, ShapeResult
from ._provenance import buffers_warning, code_version
from .static import ScanResult, scan, scan_source
from .compile import (ARCHS, CompilePool, CompileResult, CubinCache, arch_for_capability, cache_key,
                      compile_candidate, default_backend, default_cache_dir, parse_ptxas)
# GPU side (issue 4): nothing here imports torch or initialises CUDA in the importing process.
from .run import (DEFAULT_DEADLINES, LOADERS, CudaError, GpuLease, LoaderUnavailable, ParamPack, TensorMapError,
                  WorkerSupervisor, WorkerUnavailable, get_loader, gpu_key, tmap_geometry)
# Ray backend (issue 10): ray itself is imported only when a RayPool is made.
from .pools import (POOLS, PRECISE_JOB, EvaluatorPool, LocalPool, PoolStats, RayPool, RayPoolStats,
                    RayUnavailable, connect_ray, gpu_arch, visible_gpus)

__all__ = [
    "EvaluatorPool",
    "CubinCache", "cache_key", "default_cache_dir",
    "ARCHS", "CompileResult", "arch_for_capability", "compile_candidate", "default_backend",
    "CompilePool",
    "parse_ptxas",
    "code_version", "buffers_warning",
    "GpuLease", "gpu_key",
    "ScanResult", "scan", "scan_source",
    "CudaError", "LOADERS", "LoaderUnavailable", "get_loader", "POOLS",
    "JOB_OPTIONS", "EliteThreshold", "Job", "Result", "ShapeDraft", "ShapeResult",
    "PRECISE_JOB", "LocalPool", "PoolStats", "gpu_arch", "visible_gpus",
    "RayPool", "RayPoolStats", "RayUnavailable", "connect_ray",
    "ParamPack", "TensorMapError", "tmap_geometry",
    "DEFAULT_DEADLINES", "WorkerSupervisor", "WorkerUnavailable",
]
