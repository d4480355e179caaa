"""evo's runtime wing: what a process that only runs exported kernels needs.

``load_library(LIB)`` reads an export's manifest (:class:`ExportManifest`, a frozen record of
its JSON) and loads its ``libevo_hgemm.so``;
``EvoLibrary.evo_hgemm(a, b)`` runs the exported kernel for the shapes it covers and
``torch.matmul`` for the rest; ``prepare_weight`` pads a static weight once where the kernel
would copy it every call. Nothing here imports the rest of evo or its search-side dependencies
(msgpack, the archive, the compiler): loading a library needs torch alone, and torch only when
called. ``evo.torch`` (the native operators and ``nn.Linear`` patching) sits on top of this wing.
"""
from ._loader import EvoLibrary, PreparedWeight, evo_hgemm, load_library
from ._manifest import LIBRARY, MANIFEST_FILE, MANIFEST_FORMAT, ExportError, ExportManifest, KernelEntry, PreparedB

__all__ = ["LIBRARY", "MANIFEST_FILE", "MANIFEST_FORMAT", "EvoLibrary", "ExportError", "ExportManifest", "KernelEntry",
           "PreparedB", "PreparedWeight", "evo_hgemm", "load_library"]
