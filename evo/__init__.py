"""evo package: evolves HGEMM CUDA kernels per shape.

``load_library(LIB)`` loads what ``evo export`` built; ``evo_hgemm(a, b)`` multiplies through it
(torch.matmul where no exported kernel fits). Neither imports torch until called, and importing
evo loads only its runtime wing (:mod:`evo.runtime`): a process that serves a library needs
neither msgpack nor the rest of the search side.
"""
from .runtime import evo_hgemm, load_library

__all__ = ["evo_hgemm", "load_library"]
