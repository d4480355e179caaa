"""Evaluators: static scan, compile pool, GPU workers, correctness and timing.

Imports only ``populations``. Keep this file a plain list of re-exports.
"""
from ._base import EvaluatorPool
from ._cache import CubinCache, cache_key, default_cache_dir
from ._compile import ARCHS, CompileResult, arch_for_capability, compile_candidate, default_backend
from ._compile_pool import CompilePool
from ._ptxas import parse_ptxas
from ._provenance import code_version
from ._lease import GpuLease, gpu_key
from ._static import ScanResult, scan, scan_source
# GPU side (issue 4): nothing here imports torch or initialises CUDA in the importing process.
from ._loader import CudaError, LoaderUnavailable, get_loader
from ._job import JOB_OPTIONS, Job, Result, ShapeResult
from ._pool import PRECISE_JOB, LocalPool, PoolStats, gpu_arch, visible_gpus
# Ray backend (issue 10): ray itself is imported only when a RayPool is made.
from ._ray_pool import RayPool, RayPoolStats, RayUnavailable, connect_ray
from ._tmap import ParamPack, TensorMapError, tmap_geometry
from ._worker import DEFAULT_DEADLINES, WorkerSupervisor, WorkerUnavailable

__all__ = [
    "EvaluatorPool",
    "CubinCache", "cache_key", "default_cache_dir",
    "ARCHS", "CompileResult", "arch_for_capability", "compile_candidate", "default_backend",
    "CompilePool",
    "parse_ptxas",
    "code_version",
    "GpuLease", "gpu_key",
    "ScanResult", "scan", "scan_source",
    "CudaError", "LoaderUnavailable", "get_loader",
    "JOB_OPTIONS", "Job", "Result", "ShapeResult",
    "PRECISE_JOB", "LocalPool", "PoolStats", "gpu_arch", "visible_gpus",
    "RayPool", "RayPoolStats", "RayUnavailable", "connect_ray",
    "ParamPack", "TensorMapError", "tmap_geometry",
    "DEFAULT_DEADLINES", "WorkerSupervisor", "WorkerUnavailable",
]
