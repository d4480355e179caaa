"""Evaluators: static scan, compile pool, GPU workers, correctness and timing.

Imports only ``populations``. Keep this file a plain list of re-exports.
"""
from ._cache import CubinCache, cache_key, default_cache_dir
from ._compile import ARCHS, CompileResult, arch_for_capability, compile_candidate, default_backend
from ._compile_pool import CompilePool
from ._ptxas import parse_ptxas
from ._static import ScanResult, scan, scan_source

__all__ = [
    "CubinCache", "cache_key", "default_cache_dir",
    "ARCHS", "CompileResult", "arch_for_capability", "compile_candidate", "default_backend",
    "CompilePool",
    "parse_ptxas",
    "ScanResult", "scan", "scan_source",
]
