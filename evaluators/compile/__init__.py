"""Compiling a candidate: the toolkit and back ends, the isolated compile child and its fork server,
the PTX scan, machine-code (SASS) check and ptxas policy the child applies, the cubin cache and the compile pool.

``_isolate.py``, ``_zygote.py``, ``_outcome.py``, ``_ptxscan.py`` and ``_sass.py`` import only the standard library and sit in one
folder because the compile child loads them as top-level modules (see ``_zygote.py``).
"""
from ._cache import CubinCache, cache_key, default_cache_dir
from ._compile import ARCHS, CompileResult, arch_for_capability, compile_candidate, default_backend
from ._compile_pool import CompilePool
from ._ptxas import parse_ptxas
from ._toolkit import cuda_tool

__all__ = ["CubinCache", "cache_key", "default_cache_dir",
           "ARCHS", "CompileResult", "arch_for_capability", "compile_candidate", "default_backend",
           "CompilePool", "parse_ptxas", "cuda_tool"]
