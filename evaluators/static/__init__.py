"""Static checks on candidate source, before a compile is spent on it: the lexer and the scanner.

Runs in the calling process. Its modules are private; the names below are the subpackage's interface.
"""
from ._static import ScanResult, scan, scan_source, smoke_shapes

__all__ = ["ScanResult", "scan", "scan_source", "smoke_shapes"]
