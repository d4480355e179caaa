"""``evo export ARCHIVE --out LIB [--arch auto|sm_90a|...] [--verify auto|on|off] [--json]``

Builds a deployable library from an archive: per shape the best non-flagged ``ok`` kernel,
compiled with nvcc into LIB/libevo_hgemm.so with a C ABI launcher per shape
(``evo_hgemm_<M>x<N>x<K>_<LAYOUT>_f32``), the dispatchers ``evo_hgemm`` (TN) and
``evo_hgemm_nn`` (NN), the generated sources under LIB/src, and LIB/manifest.json (shapes,
sources' sha256, measured speedups per timer, workspace bytes, GPU and provenance, and the shapes
skipped with the reason). A shape whose best kernel is not faster than cuBLAS in GPU time by more
than 2% (the timings' noise) is
left to cuBLAS (the manifest's paths say which path each shape takes and why; --keep-slower
exports it anyway). With --verify (auto, the default: where a GPU of the export's architecture is
visible; on: required; off) the top --verify-top candidates of every shape are re-timed beside
cuBLAS in both layouts first, and a shape keeps the fastest only where it beats cuBLAS by
--verify-margin (in the shape's own layout, the call the fallback makes; --verify-against best: the
better of both layouts); the manifest records both timings. Load it in Python with
``evo.load_library(LIB)``. ``--arch auto`` (the default) is the architecture the archive's best
kernels were measured on.
Every log of the archive is checksummed first; damage is reported on stderr (file, offset, bytes,
records lost) and refused (exit 3, nothing written) unless --allow-damaged, which exports what
survived and lists the damage in the manifest (``damage``).
Exit status 0, or 2 with one line on stderr and nothing written for bad input, an unwritable
LIB, an archive with nothing to export, or a failed build; 3 for a damaged archive.
"""
from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Optional

from ._cmd_args import (EXIT_BAD_INPUT, add_allow_damaged, add_archive, add_arch, add_json, archive_of, fail,
                        open_reader, refuse_damage, resolve_arch, warn)
from ..export import MARGIN, TOP_K, Verify, child_timer

__all__ = ["add_parser", "run", "measured_arch", "verify_plan"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("export", help="build a shared library of the best kernel per shape",
                              description=__doc__.split("\n\n")[1])
    add_archive(p)
    p.add_argument("--out", required=True, metavar="LIB", help="output directory (new, or an earlier export to replace)")
    add_arch(p)
    p.add_argument("--keep-slower", action="store_true",
                   help="also export kernels not faster than cuBLAS (by default those shapes are left to cuBLAS)")
    p.add_argument("--verify", choices=("auto", "on", "off"), default="auto",
                   help="re-time the top candidates of every shape and cuBLAS (both layouts) on the GPU before "
                        "choosing each shape's path: auto (default) where a GPU of the export's architecture is "
                        "visible, on (an error without one), off (decide by the archive's speedups)")
    p.add_argument("--verify-top", type=int, default=TOP_K, metavar="K",
                   help=f"candidates per shape to re-time (default {TOP_K})")
    p.add_argument("--verify-margin", type=float, default=MARGIN, metavar="X",
                   help=f"keep a kernel only if it is at least 1+X times as fast as cuBLAS in the re-timing "
                        f"(default {MARGIN})")
    p.add_argument("--verify-against", choices=("layout", "best"), default="layout",
                   help="the cuBLAS to beat: layout (default) cuBLAS in the shape's own layout, the call the "
                        "fallback makes; best the better of the TN and NN calls")
    p.add_argument("--verify-once", action="store_true",
                   help="keep a kernel on one re-timing; by default each kept kernel is re-timed again in a fresh "
                        "process and kept only if it beats cuBLAS there too")
    add_allow_damaged(p, "the manifest's damage list")
    add_json(p, "the library's manifest")


def verify_plan(mode: str, arch: str, top: int, margin: float, against: str = "layout",
                gpu: Callable[[], Optional[str]] = lambda: _gpu_arch(), confirm: bool = True) -> tuple[Optional[Verify], str]:
    """(how to re-time, or None and why not) for ``--verify mode``; ValueError for ``on`` without a
    GPU of ``arch``, or a bad ``top``/``margin``. ``gpu`` (the visible GPU's arch) is a seam for tests."""
    if mode == "off":
        return None, "--verify off"
    here = gpu()
    if here is None or here.rstrip("a") != arch.rstrip("a"):
        why = "no GPU is visible" if here is None else f"the visible GPU is {here}, the export is for {arch}"
        if mode == "on":
            raise ValueError(f"--verify on: {why}; re-timing needs a GPU of the export's architecture")
        return None, f"--verify auto: {why}"
    return Verify(child_timer(log=lambda msg: warn("export", msg)), top_k=top, margin=margin, against=against,
                  confirm=confirm), ""


def _gpu_arch() -> Optional[str]:
    from evaluators import gpu_arch

    return gpu_arch()


def measured_arch(archive: Any) -> Optional[str]:
    """The architecture most of the shapes' best kernels were measured on (None: no elite anywhere)."""
    archs = Counter(e[0].latest.arch for e in (archive.elites(s, top=1) for s in archive.shapes()) if e)
    return archs.most_common(1)[0][0] if archs else None


def _exportable(archive: Any, path: str, arch: str) -> str:
    """The concrete arch to build for; ExportError-worthy problems raise ValueError with what would work."""
    measured = measured_arch(archive)
    if measured is None:
        shapes = archive.shapes()
        what = f"{len(shapes)} shape(s) but no ok, unflagged evaluation" if shapes else "no shapes"
        raise ValueError(f"{path}: nothing to export: the archive has {what}; evaluate kernels first "
                         f"(evo run {path} --shape ...)")
    return measured if arch.lower() == "auto" else resolve_arch(arch)  # type: ignore[return-value]


def run(args: Any) -> int:
    from populations import ArchiveError

    from ..export import ExportError, export

    out = Path(args.out)
    existed = out.exists()
    try:
        path = archive_of(args)
        archive, problems = open_reader("export", path)
        try:
            refused = refuse_damage("export", path, problems, args.allow_damaged)  # type: ignore[arg-type]
            if refused is not None:
                return refused
            arch = _exportable(archive, path, args.arch)  # type: ignore[arg-type]
        finally:
            archive.close()
        verify, verify_why = verify_plan(args.verify, arch, args.verify_top, args.verify_margin, args.verify_against,
                                            confirm=not args.verify_once)
        manifest = export(path, args.out, arch, keep_slower=args.keep_slower, verify=verify, verify_why=verify_why,
                          damage=problems)
    except (ExportError, ArchiveError, ValueError) as exc:
        return fail("export", exc)
    except OSError as exc:
        return fail("export", f"--out {args.out}: cannot write the library there: {exc.strerror or exc}")
    if manifest.test_double:
        warn("export", "the timings behind this library come from a test double (provenance pool=fake), not from a "
                       "GPU; manifest.json says test_double: true")
    if not manifest.kernels:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)  # a library of 0 kernels is no success: leave nothing
        reasons = "; ".join(f"{s['shape']}: {s['reason']}" for s in manifest.skipped)
        tries = ([] if args.arch.strip().lower() == "auto" else
                 ["--arch auto (the architecture the kernels were measured on)"]) + ["--keep-slower where every kernel lost to cuBLAS"]
        return fail("export", f"no kernel could be exported for {arch} ({reasons}); try " + ", or ".join(tries),
                    EXIT_BAD_INPUT)
    if args.json:
        json.dump(manifest.to_dict(), sys.stdout, indent=1, sort_keys=True, default=str)
        sys.stdout.write("\n")
        return 0
    for e in manifest.kernels:
        speed = " ".join(f"{k} {v:.3f}x" for k, v in e.speedups.items())
        kept = next((c for c in (e.verify or {}).get("candidates", []) if c["candidate"] == e.candidate), None)
        retimed = f"  re-timed {kept['speedup']:.3f}x" if kept else ""
        print(f"{e.shape:>26}  {e.template or 'free-form':>12}  {e.candidate}  {speed}{retimed}")
    for s in manifest.skipped:
        print(f"{s['shape']:>26}  cuBLAS: {s['reason']}")
    v = manifest.verify
    against = "in the shape's layout" if v.get("against") == "layout" else "in its better layout"
    how = (f"re-timed: top {v['top_k']} per shape, margin {v['margin']:.0%} against cuBLAS {against}"
           if v["ran"] else f"not re-timed: {v['why']}")
    print(f"{len(manifest.kernels)} kernels -> {args.out}/{manifest.library} ({how})")
    return 0
