"""evo's export wing: from an archive to a library users ship (``evo export``).

``export`` picks each shape's best kernel (``choose_path``: never slower than cuBLAS), writes
the units and launchers (``_export_source.py``), re-times the top candidates beside cuBLAS
(``_export_verify.py``, ``_export_timer.py``) and builds ``libevo_hgemm.so`` with its manifest.
Loading a library is the runtime wing's (``evo.runtime``), which this one re-exports.
"""
from ._export import (LIBRARY, MANIFEST_FORMAT, EvoLibrary, ExportError, PreparedWeight, choose_path, evo_hgemm,
                      export, from_test_double, load_library, staged_dir)
from ._export_verify import MARGIN, TOP_K, Verify, child_timer

__all__ = ["LIBRARY", "MANIFEST_FORMAT", "EvoLibrary", "ExportError", "PreparedWeight", "choose_path", "evo_hgemm",
           "export", "from_test_double", "load_library", "staged_dir", "MARGIN", "TOP_K", "Verify", "child_timer"]
