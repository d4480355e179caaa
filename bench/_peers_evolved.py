"""Where the peers benchmark gets each shape's best evolved kernel, and how it calls it.

Preferred: the exported library (``evo export``: one C launcher per shape with the plan's
constants; the bench calls it through ctypes with pre-bound device pointers, the low-overhead
host path the ``offline`` and ``server`` timers reward). From an archive the bench exports first
(into a work directory, not the output directory). Where the export fails, skips a shape, or
cannot be loaded on this GPU, the shape's elite is compiled (NVRTC, ``compile_candidate``) and
launched the way the evaluator does (``evaluators.run._kernels.CandidateKernels``: cuda-python
``cuLaunchKernel`` per launch); ``path`` says which, and why, and goes into the CSV.

Shape selection (:func:`evolved_shapes`) needs no GPU; :meth:`Evolved.prepare` exports and
compiles before CUDA is initialised in this process (the compile children are forked), and
:meth:`Evolved.load` then opens the library on the GPU.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

from populations import Archive, Candidate, Shape

__all__ = ["EvolvedKernel", "Evolved", "evolved_shapes", "SourceError"]


class SourceError(Exception):
    """The archive or library given cannot be read: one line for the user."""


@dataclass
class EvolvedKernel:
    """One shape's evolved kernel: ``bind(a, b_stored, c, workspace) -> call()``."""

    shape: Shape
    candidate: str
    template: str
    archived_speedup: Optional[float]
    path: str
    workspace_bytes: int
    bind: Callable[[Any, Any, Any, Any], Callable[[], None]]
    op: bool = False  # torch.ops.evo.hgemm routes this shape to the exported kernel


def _manifest_entries(library: Path) -> dict[Shape, Any]:
    """The export's kernel entries (evo.runtime.KernelEntry) by shape."""
    from evo.runtime import ExportError, ExportManifest

    try:
        manifest = ExportManifest.read(library)
    except ExportError as exc:
        raise SourceError(f"{library}: not an evo export ({exc})") from None
    return {Shape.parse(e.shape): e for e in manifest.kernels}


def _open_archive(path: Path) -> Archive:
    from populations import ArchiveError

    try:
        return Archive(path, "r")
    except (ArchiveError, OSError) as exc:
        raise SourceError(f"{path}: cannot open the archive ({exc})") from None


def evolved_shapes(archive: Optional[Path], library: Optional[Path]) -> tuple[list[Shape], list[str]]:
    """Shapes with a non-flagged ``ok`` elite of the f32 contract (archive), or exported
    (library); plus notes on shapes left out."""
    notes: list[str] = []
    if library is not None:
        return sorted(_manifest_entries(library), key=lambda s: (s.flops, str(s))), notes
    assert archive is not None
    arch = _open_archive(archive)
    shapes, without = [], []
    for s in arch.shapes():
        if not arch.elites(s, top=1):
            without.append(str(s))
            continue
        if s.contract != "f32":
            notes.append(f"{s}: contract {s.contract} is not torch.matmul's; not benchmarked")
            continue
        shapes.append(s)
    if without:
        notes.append(f"{len(without)} archived shape(s) without an ok, unflagged kernel left out: {', '.join(without)}")
    return sorted(shapes, key=lambda s: (s.flops, str(s))), notes


class Evolved:
    """The evolved kernels of an archive or an exported library (see the module docstring)."""

    def __init__(self, archive: Optional[Path], library: Optional[Path], work: Path, arch: str = "sm_90a",
                 log: Callable[[str], None] = print) -> None:
        self.archive_path, self.library_path, self.work, self.arch, self.log = archive, library, work, arch, log
        self.entries: dict[Shape, Any] = {}  # evo.runtime.KernelEntry by shape
        self.export_note = ""
        self.lib: Any = None
        self.archive: Optional[Archive] = None
        self.cubins: dict[Shape, tuple[Candidate, Any]] = {}
        self.compile_notes: dict[Shape, str] = {}

    # -- before CUDA ---------------------------------------------------------------------------
    def prepare(self, shapes: list[Shape], jobs: Optional[int] = None) -> None:
        """Export (from an archive) or read the manifest (library); compile what the library lacks."""
        from evo.export._export import ExportError, export

        if self.library_path is None:
            assert self.archive_path is not None
            self.archive = _open_archive(self.archive_path)
            t0 = time.monotonic()
            lib_dir = self.work / "lib"
            try:
                export(self.archive_path, lib_dir, self.arch, jobs=jobs)
                self.library_path = lib_dir
                self.log(f"exported the archive's best kernels to {lib_dir} in {time.monotonic() - t0:.1f} s")
            except (ExportError, OSError) as exc:
                self.export_note = f"export failed: {exc}"
                self.log(f"evo export failed ({exc}); every shape uses the evaluator's launch path")
        else:
            manifest_archive = None
            try:
                from evo.runtime import ExportManifest

                manifest_archive = ExportManifest.read(self.library_path).archive
            except Exception:
                pass
            if manifest_archive and Path(manifest_archive).is_dir():
                self.archive = _open_archive(Path(manifest_archive))
        if self.library_path is not None:
            self.entries = _manifest_entries(self.library_path)
        missing = [s for s in shapes if s not in self.entries]
        self._compile(missing, "not in the exported library" if self.library_path else self.export_note)

    def _compile(self, shapes: list[Shape], why: str) -> None:
        """The evaluator's path for ``shapes``: compile their elites (NVRTC)."""
        if not shapes:
            return
        if self.archive is None:
            for s in shapes:
                self.compile_notes[s] = f"none: {why or 'not exported'}, and no archive to compile from"
            return
        from concurrent.futures import ThreadPoolExecutor

        from evaluators import compile_candidate

        todo = []
        for s in shapes:
            elites = self.archive.elites(s, top=1)
            if not elites or elites[0].candidate is None:
                self.compile_notes[s] = "none: no ok, unflagged kernel in the archive"
            else:
                todo.append((s, elites[0].candidate))
        if todo:
            self.log(f"compiling {len(todo)} kernel(s) for the evaluator's launch path ({why or 'not exported'})")
        with ThreadPoolExecutor(max(1, min(len(todo), os.cpu_count() or 2))) as pool:  # isolated children: real parallelism
            results = list(pool.map(lambda sc: compile_candidate(sc[1], self.arch), todo))
        for (s, cand), res in zip(todo, results):
            if not res.ok:
                self.compile_notes[s] = f"none: {why}; evaluator compile failed: {res.message.splitlines()[0][:160]}"
                continue
            self.cubins[s] = (cand, res.cubin)
            self.compile_notes[s] = f"evaluator: {why}" if why else "evaluator"

    # -- on the GPU ----------------------------------------------------------------------------
    def load(self) -> None:
        """Open the library on this GPU (CUDA initialised here); if it cannot be used, compile its
        shapes for the evaluator's path instead."""
        if self.library_path is None:
            return
        from evo.export._export import load_library

        self.lib = load_library(self.library_path)
        if not self.lib.active:
            why = f"library not usable here: {self.lib.reason}"
            self.log(why)
            os.environ.setdefault("EVO_COMPILE_ZYGOTE", "0")  # CUDA is initialised: spawn, do not fork
            self._compile(list(self.entries), why)
            self.entries = {}

    def kernel(self, shape: Shape) -> tuple[Optional[EvolvedKernel], str]:
        """The shape's kernel, or None and why not."""
        entry = self.entries.get(shape)
        if entry is not None and self.lib is not None and self.lib.active:
            key = (shape.m, shape.n, shape.k, shape.layout)
            fn, ws = self.lib.launcher(key)
            archived = entry.fitness if entry.fitness is not None else entry.speedups.get("device")  # the elite's, as below
            return EvolvedKernel(shape, entry.candidate, entry.template or "free-form", archived, "export", ws,
                                 _export_binder(fn, shape), op=True), ""
        if shape in self.cubins:
            cand, cubin = self.cubins[shape]
            elite = self.archive.elites(shape, top=1)[0] if self.archive else None
            return EvolvedKernel(shape, cand.id, cand.template or "free-form", elite.fitness if elite else None,
                                 self.compile_notes[shape], _workspace_of(cand, shape),
                                 _evaluator_binder(cand, cubin, shape)), ""
        return None, self.compile_notes.get(shape, "none: no evolved kernel for this shape")


def _workspace_of(cand: Candidate, shape: Shape) -> int:
    return int(cand.plan.resolve(shape)[1])


def _export_binder(fn: Any, shape: Shape) -> Callable[[Any, Any, Any, Any], Callable[[], None]]:
    import torch

    m, n, k = shape.m, shape.n, shape.k

    def bind(a: Any, b: Any, c: Any, w: Any) -> Callable[[], None]:
        pa, pb, pc, pw = a.data_ptr(), b.data_ptr(), c.data_ptr(), (w.data_ptr() if w is not None else None)
        current = torch.cuda.current_stream

        def call() -> None:
            rc = fn(pa, pb, pc, m, n, k, pw, current().cuda_stream)
            if rc:
                raise RuntimeError(f"exported launcher for {shape} returned {rc}")
        return call
    return bind


_LOADER: list[Any] = []


def _evaluator_binder(cand: Candidate, cubin: bytes, shape: Shape) -> Callable[[Any, Any, Any, Any], Callable[[], None]]:
    from evaluators import get_loader
    from evaluators.run._kernels import CandidateKernels

    if not _LOADER:
        _LOADER.append(get_loader("driver"))
    kernels = CandidateKernels(_LOADER[0], cubin, cand.plan)
    run, _, _ = kernels.bind(shape)

    def bind(a: Any, b: Any, c: Any, w: Any) -> Callable[[], None]:
        ptrs = {"A": a.data_ptr(), "B": b.data_ptr(), "C": c.data_ptr(), "workspace": w.data_ptr() if w is not None else 0}

        def call() -> None:
            run(ptrs, w)
        return call
    bind.kernels = kernels  # type: ignore[attr-defined]  (keeps the module loaded)
    return bind
