"""``evo export ARCHIVE --out LIB [--arch sm_90a]``

Builds a deployable library from an archive: per shape the best non-flagged ``ok`` kernel,
compiled with nvcc into LIB/libevo_hgemm.so with a C ABI launcher per shape
(``evo_hgemm_<M>x<N>x<K>_<LAYOUT>_f32``), the dispatchers ``evo_hgemm`` (TN) and
``evo_hgemm_nn`` (NN), the generated sources under LIB/src, and LIB/manifest.json (shapes,
sources' sha256, measured speedups per timer, workspace bytes, GPU and provenance, and the shapes
skipped with the reason). A shape whose best kernel is not faster than cuBLAS in GPU time is
left to cuBLAS (the manifest's paths say which path each shape takes and why). Load it in Python with ``evo.load_library(LIB)``.
Exit status 0, or 2 with one line on stderr and nothing written for bad input or a failed build.
"""
from __future__ import annotations

import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="build a shared library of the best kernel per shape",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("archive", metavar="ARCHIVE", help="archive directory")
    p.add_argument("--out", required=True, metavar="LIB", help="output directory (new, or an earlier export to replace)")
    p.add_argument("--arch", default="sm_90a", help="target architecture, as the evaluations were measured (default sm_90a)")
    p.add_argument("--keep-slower", action="store_true",
                   help="also export kernels not faster than cuBLAS (by default those shapes are left to cuBLAS)")


def run(args: Any) -> int:
    from populations import ArchiveError

    from ._export import ExportError, export

    try:
        manifest = export(args.archive, args.out, args.arch, keep_slower=args.keep_slower)
    except (ExportError, ArchiveError) as exc:
        print(f"evo export: {exc}", file=sys.stderr)
        return 2
    for e in manifest["kernels"]:
        speed = " ".join(f"{k} {v:.3f}x" for k, v in e["speedups"].items())
        print(f"{e['shape']:>26}  {e['template'] or 'free-form':>12}  {e['candidate']}  {speed}")
    for s in manifest["skipped"]:
        print(f"{s['shape']:>26}  cuBLAS: {s['reason']}")
    print(f"{len(manifest['kernels'])} kernels -> {args.out}/{manifest['library']}")
    return 0
