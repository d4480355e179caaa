"""``evo export``: the best kernel per shape as a shared library, and its torch loader.

Export (:func:`export`) takes per shape the best non-flagged ``ok`` candidate
(:meth:`Archive.elites`), resolves its launch plan for that shape into constants, and writes

- ``src/k_<key>.cu``: the candidate's translation unit, its kernels renamed ``evo_<key>_<name>``
  (``#define``) and its code inside an anonymous namespace, so that nothing two units define
  (kernels, helpers, constants, host shadows of ``__device__`` variables) collides when the
  library is linked, plus an ``extern "C"`` accessor returning each kernel's address;
- ``src/launchers.cu``: per shape ``extern "C" int evo_hgemm_<key>(A, B, C, M, N, K, workspace,
  stream)`` running the plan (cudaLaunchKernel with the argument array; TMA descriptors encoded
  per call with ``cuTensorMapEncodeTiled``, fetched from the driver through the runtime's
  ``cudaGetDriverEntryPointByVersion``, so no ``-lcuda`` stub is needed), and the dispatchers
  ``evo_hgemm`` (TN) and ``evo_hgemm_nn`` (NN), which return -1 for a shape not exported; and
  where the kernel's plan stages B (the alignment transform: B's pitch is ragged), also
  ``evo_hgemm_<key>_wb(A, B, ldb, C, M, N, K, workspace, stream)`` for a B the caller padded
  once (rows ``ldb`` elements apart): no per-call copy of B, named by the entry's ``prepared_b``;
- ``libevo_hgemm.so`` (nvcc ``-shared``) and ``manifest.json``.

Never slower than cuBLAS: a shape whose best kernel did not beat cuBLAS in GPU time by more than
the timings' noise (median device-timer speedup <= 1.02), or that has no exportable kernel, is not
given a launcher; the
dispatchers return -1 for it and every caller (the loader, the torch ops) runs cuBLAS there. The
manifest's ``paths`` says which path each shape of the archive takes and why
(:func:`choose_path`). With ``verify`` (``evo export --verify``, :mod:`evo.export._export_verify`) the
archive's timing is not trusted alone: the top candidates of every shape are linked into a trial
library, re-timed beside cuBLAS in both layouts on the GPU, and a shape keeps the fastest only
where it beats cuBLAS (the call the fallback would make) by a margin; the others' units are dropped.

Everything is built in a temporary directory beside ``--out`` and renamed into place at the end:
a failure leaves nothing half-written. A kernel unit nvcc refuses is left out of the library
(listed under ``skipped`` with nvcc's error, the dispatchers do not know its shape); the export
fails only when no kernel builds or the launchers do not. Launchers return 0, or a ``cudaError_t`` / negative code
(-1 unknown shape, -2 shape mismatch, -3 missing workspace, -4 tensor map encoding failed, -5 bad ``ldb``).

The sources are written by :mod:`evo.export._export_source`; the loader (``evo.load_library``,
``EvoLibrary``) is in the runtime wing, :mod:`evo.runtime`, its names re-exported here.

Thread-block clusters: a plan carries no cluster shape; kernels that need clusters declare
``__cluster_dims__`` at compile time (the sm90_wgmma template with ``CLUSTER_M`` or ``CLUSTER_N`` 2 or 4), and such
kernels launch through the classic ``cudaLaunchKernel`` (like ``<<<>>>``) as long as the grid is
a multiple of the cluster shape, which the plan's grid expression guarantees. Only a cluster
shape chosen at launch time would need ``cudaLaunchKernelEx`` with a cluster attribute.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence, Union

from populations import Archive, Elite, PlanError, Shape

from ..runtime import (LIBRARY, MANIFEST_FILE, MANIFEST_FORMAT, EvoLibrary, ExportError, ExportManifest,  # noqa: F401
                       KernelEntry, PreparedB, PreparedWeight, evo_hgemm, load_library)  # re-exported
from ._export_source import PRELUDE, dispatcher, kernel_unit, launcher, prepared_b
from ._export_verify import MARGIN, Verify, confirm, decide

__all__ = ["ExportError", "export", "choose_path", "load_library", "evo_hgemm", "EvoLibrary", "PreparedWeight", "staged_dir", "MANIFEST_FORMAT", "LIBRARY"]

NVCC = os.environ.get("EVO_NVCC", "/usr/local/cuda/bin/nvcc")


def _gencode(arch: str) -> str:
    digits = arch[3:] if arch.startswith("sm_") else ""
    if not digits[:2].isdigit() or not (digits[2:] in ("", "a")):
        raise ExportError(f"unknown architecture {arch!r}: use e.g. sm_90a or sm_80")
    return f"-gencode=arch=compute_{digits},code=sm_{digits}"


def _evo_version() -> str:
    try:
        from evaluators import code_version

        return code_version()
    except Exception:  # pragma: no cover - provenance is best effort
        return "unknown"


# -- choosing and describing -----------------------------------------------------------------
def _picks(archive: Archive, shape: Shape, arch: str, top: int = 1) -> tuple[list[Elite], str]:
    """The shape's best ``top`` exportable elites (archive order), or none and why not."""
    if shape.contract != "f32":
        return [], f"contract {shape.contract} is not torch.matmul's (fp32 accumulation); only f32 is exported"
    elites = archive.elites(shape, top=None)
    if not elites:
        return [], "no ok, unflagged measurement"
    reasons, picks = [], []
    for e in elites:
        if e.candidate is None:
            reasons.append(f"{e.candidate_id}: candidate record lost")
        elif e.latest.arch and e.latest.arch != arch:
            reasons.append(f"{e.candidate_id}: measured on {e.latest.arch}, exporting for {arch}")
        else:
            picks.append(e)
            if len(picks) == top:
                break
    return picks, "" if picks else "; ".join(reasons[:3])


def _pick(archive: Archive, shape: Shape, arch: str) -> tuple[Optional[Elite], str]:
    """The shape's best exportable elite, or None and why not."""
    picks, why = _picks(archive, shape, arch)
    return (picks[0] if picks else None), why


def choose_path(elite: Optional[Elite], why: str = "", *, keep_slower: bool = False,
                margin: float = MARGIN) -> tuple[str, str]:
    """Which path a shape takes in the export, ``("evolved" | "cublas", why)``.

    The library must never be slower than cuBLAS: a shape goes to its evolved kernel only when
    that kernel beat cuBLAS in GPU time by more than ``margin``, i.e. its fitness (the median
    device-timer speedup over cuBLAS of its ok, unflagged measurements) is above 1 + ``margin``
    (default 2%, the re-timing's margin: the evaluator's timings agree with an independent
    re-timing within about 2%, so a kernel at 1.009x of one measurement, exported, ran 0.992x of
    torch.matmul in bench/model_op_check.py on the H200). Otherwise, or with no exportable
    kernel (``why`` says why not), the shape is left to cuBLAS: the dispatchers do not know it
    and the loader's op sends it to torch.matmul. ``keep_slower`` exports the best kernel whatever
    its speed (for benchmarking kernels, not for users)."""
    if elite is None:
        return "cublas", f"no exportable kernel ({why})" if why else "no exportable kernel"
    speed = elite.fitness
    n = len(elite.evaluations)
    measured = f"{speed:.3f}x of cuBLAS in GPU time (median device speedup of {n} measurement{'s' * (n != 1)})"
    if keep_slower:
        return "evolved", f"{elite.candidate_id}: {measured}; kept by keep_slower"
    if speed is None or not speed > 1.0 + margin:
        gain = f" by more than {margin:.0%}" if margin else ""
        return "cublas", f"best kernel {elite.candidate_id} is not faster than cuBLAS{gain}: {measured}"
    return "evolved", f"{elite.candidate_id}: {measured}"


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """A fresh directory beside ``out`` to build in: renamed onto ``out`` when the block ends well
    (an earlier ``out`` moved aside first, then deleted), removed when it raises. Nothing
    half-written is ever at ``out``."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        os.chmod(tmp, 0o755)
        yield tmp
        if out.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old.", dir=out.parent))
            os.rename(out, old / "x")
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# -- building ---------------------------------------------------------------------------------
def _nvcc(args: list[str], cwd: Path) -> None:
    try:
        out = subprocess.run([NVCC, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ExportError(f"nvcc failed to run: {exc}") from None
    if out.returncode:
        first = next((ln for ln in (out.stderr + out.stdout).splitlines() if "error" in ln), out.stderr.strip()[:300])
        raise ExportError(f"nvcc {' '.join(a for a in args if a.endswith(('.cu', '.so')))}: {first}")


def _entry(shape: Shape, elite: Elite, unit: str, workspace: int, arch: str, **more: Any) -> KernelEntry:
    """The manifest's record of one exported kernel (``more``: why, prepared_b, verify)."""
    cand, last = elite.candidate, elite.latest
    assert cand is not None
    return KernelEntry(
        shape=str(shape), key=shape.key, m=shape.m, n=shape.n, k=shape.k,
        layout=shape.layout, contract=shape.contract, symbol=f"evo_hgemm_{shape.key}",
        candidate=cand.id, template=cand.template, knobs=dict(cand.knobs) if cand.knobs else None,
        operator=cand.operator, generation=cand.generation,
        source_sha256=hashlib.sha256(cand.source.encode()).hexdigest(),
        unit_sha256=hashlib.sha256(unit.encode()).hexdigest(),
        fitness=elite.fitness, measurements=len(elite.evaluations),
        speedups={name: t.speedup for name, t in sorted(last.timers.items())},
        baselines={name: t.baseline_name for name, t in sorted(last.timers.items())},
        workspace_bytes=workspace, zero_workspace=bool(cand.plan.zero_workspace),
        tensor_maps=tuple(sorted(cand.plan.tensor_maps)), arch=last.arch or arch,
        provenance=dict(last.provenance), measured_at=last.created,
        measurement=last.measurement.to_dict() if last.measurement else None, **more)


def from_test_double(evaluation: Any) -> bool:
    """The evaluation was made by a test double (the fake pool's ``provenance["pool"]``), not measured
    on a GPU: a library or report built on it must say so, or it reads as a measured one."""
    return (evaluation.provenance or {}).get("pool") == "fake"


_FLAGS = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-w"]


def _compile_units(tmp: Path, units: list[str], gencode: str, jobs: Optional[int]) -> dict[str, str]:
    """nvcc -c every kernel unit of ``tmp/src`` in parallel; returns {unit: nvcc's error} for the
    units that did not compile (their sources are removed: ``src`` holds what the library holds)."""
    def one(unit: str) -> Optional[str]:
        try:
            _nvcc([gencode, *_FLAGS, "-c", unit, "-o", unit[:-3] + ".o"], tmp / "src")
        except ExportError as exc:
            return str(exc)
        return None
    if not units:
        return {}
    with ThreadPoolExecutor(max_workers=jobs or min(len(units), os.cpu_count() or 2)) as pool:
        errors = dict(zip(units, pool.map(one, units)))
    failed = {u: e for u, e in errors.items() if e is not None}
    for u in failed:
        (tmp / "src" / u).unlink()
    return failed


def _link(src: Path, objects: list[str], gencode: str, launchers: str, library: Path) -> None:
    """Compile ``src/launchers`` and link it with the compiled units' ``objects`` into ``library``."""
    obj = launchers[:-3] + ".o"
    _nvcc([gencode, *_FLAGS, "-c", launchers, "-o", obj], src)
    _nvcc([gencode, "-shared", "-o", str(library), obj, *objects], src)


@dataclass
class _Trial:
    """One candidate of one shape, written as a unit (``k_<tag>.cu``) of the build."""

    shape: Shape
    rank: int          # its place among the shape's exportable elites (0: the archive's best)
    elite: Elite
    why: str           # the archive decision (choose_path's reason); replaced by a verified one
    kernels: list[str]
    workspace: int = 0

    @property
    def tag(self) -> str:
        return self.shape.key if self.rank == 0 else f"{self.shape.key}_r{self.rank}"

    @property
    def unit(self) -> str:
        return f"k_{self.tag}.cu"

    def launcher(self, symbol: str) -> str:
        cand = self.elite.candidate
        assert cand is not None
        return launcher(self.shape, cand, self.kernels, self.tag, symbol)[0]

    def prepared(self) -> Optional[PreparedB]:
        """The manifest's ``prepared_b`` (the launcher for a B padded once), or None where the plan
        does not stage B."""
        cand = self.elite.candidate
        assert cand is not None
        copy = prepared_b(cand, self.shape)
        if copy is None:
            return None
        return PreparedB(symbol=f"evo_hgemm_{self.shape.key}_wb", rows=copy.rows, cols=copy.cols, pitch_multiple=8,
                         abi="int f(const void* A, const void* B, long long ldb, void* C, int M, int N, int K, "
                             "void* workspace, cudaStream_t stream); B as stored, rows ldb elements apart (ldb % 8 == 0, "
                             "ldb >= cols); -5 = bad ldb")

    def prepared_launcher(self) -> str:
        cand = self.elite.candidate
        assert cand is not None
        return launcher(self.shape, cand, self.kernels, self.tag, f"evo_hgemm_{self.shape.key}_wb", prepared=True)[0]


def _unit_kernels(cand: Any) -> list[str]:
    """The kernels a unit exposes: the plan's, plus ``evo_stage`` where a fused copy of A and B is
    launched (the prepared-B launcher copies A alone with it)."""
    names = list(cand.plan.kernel_names)
    if "evo_stage2" in names and "evo_stage" not in names:
        names.append("evo_stage")
    return names


def _select(archive: Archive, arch: str, keep_slower: bool, top: int,
            verify: bool) -> tuple[list[_Trial], list[dict[str, str]]]:
    """The candidates to build (per shape the archive's best, or with ``verify`` its ``top`` best
    whatever their archive speedup: the re-timing decides) and the shapes left to cuBLAS now."""
    trials: list[_Trial] = []
    skipped: list[dict[str, str]] = []
    for shape in archive.shapes():
        picks, why = _picks(archive, shape, arch, top if verify else 1)
        path, why = choose_path(picks[0] if picks else None, why, keep_slower=keep_slower)
        if not picks or (path == "cublas" and not verify):
            skipped.append({"shape": str(shape), "reason": why})
            continue
        trials += [_Trial(shape, r, e, why, _unit_kernels(e.candidate)) for r, e in enumerate(picks)]  # type: ignore[union-attr]
    return trials, skipped


def _write_units(tmp: Path, trials: list[_Trial], dropped: dict[Shape, list[str]]) -> list[_Trial]:
    """Write every trial's unit under ``tmp/src``; one whose plan does not resolve at its shape is
    left out, with the reason in ``dropped``."""
    written = []
    for t in trials:
        cand = t.elite.candidate
        assert cand is not None
        try:
            _, t.workspace = launcher(t.shape, cand, t.kernels, t.tag)
        except (PlanError, ValueError) as exc:  # a plan or tensor map not valid at this shape
            dropped.setdefault(t.shape, []).append(f"{cand.id}: {exc}")
            continue
        (tmp / "src" / t.unit).write_text(kernel_unit(t.shape, cand, t.kernels, t.tag))
        written.append(t)
    return written


def _verified(tmp: Path, trials: list[_Trial], gencode: str, verify: Verify,
              keep_slower: bool) -> tuple[list[_Trial], dict[str, dict[str, Any]]]:
    """Link every trial into a trial library, re-time it (``verify.timer``), and keep per shape the
    trial :func:`decide` keeps, when a second timer call confirms it (``verify.confirm``,
    :func:`confirm`); returns (kept trials, {shape: decision})."""
    src = tmp / "src"
    (src / "trial_launchers.cu").write_text("\n".join([PRELUDE, *[t.launcher(f"evo_hgemm_{t.tag}") for t in trials]]))
    trial_lib = tmp / "trial" / "libevo_trial.so"
    trial_lib.parent.mkdir()
    _link(src, [t.unit[:-3] + ".o" for t in trials], gencode, "trial_launchers.cu", trial_lib)
    by_shape: dict[Shape, list[_Trial]] = {}
    for t in trials:
        by_shape.setdefault(t.shape, []).append(t)
    plan = [{"shape": str(s), "m": s.m, "n": s.n, "k": s.k, "layout": s.layout,
             "candidates": [{"symbol": f"evo_hgemm_{t.tag}", "workspace": t.workspace} for t in ts]}
            for s, ts in by_shape.items()]
    timings = verify.timer(trial_lib, plan)
    kept, decisions = [], {}
    for shape, ts in by_shape.items():
        rows = [{"symbol": f"evo_hgemm_{t.tag}", "candidate": t.elite.candidate_id, "rank": t.rank,
                 "fitness": t.elite.fitness} for t in ts]
        d = decide(rows, timings.get(str(shape), {"error": "not re-timed"}), shape.layout, verify.margin, keep_slower,
                   verify.against)
        decisions[str(shape)] = d
    if verify.confirm and not keep_slower:  # the winners once more, alone, in a second timer call
        again = [{**item, "candidates": [c for c in item["candidates"] if c["symbol"] == decisions[item["shape"]]["symbol"]]}
                 for item in plan if decisions[item["shape"]]["path"] == "evolved"]
        seconds = verify.timer(trial_lib, again) if again else {}
        for item in again:
            name = item["shape"]
            decisions[name] = confirm(decisions[name], seconds.get(name, {"error": "not re-timed"}), item["layout"],
                                      verify.margin, verify.against)
    for shape, ts in by_shape.items():
        d = decisions[str(shape)]
        for t in ts:
            if f"evo_hgemm_{t.tag}" == d["symbol"]:
                t.why = d["why"]
                kept.append(t)
    shutil.rmtree(trial_lib.parent)
    for name in ("trial_launchers.cu", "trial_launchers.o"):
        (src / name).unlink()
    return kept, decisions


def export(archive_path: Union[str, os.PathLike], out: Union[str, os.PathLike], arch: str = "sm_90a",
           *, jobs: Optional[int] = None, keep_slower: bool = False, verify: Optional[Verify] = None,
           verify_why: str = "", damage: Sequence[str] = ()) -> ExportManifest:
    """Build the library at ``out`` (which must not exist, or be an earlier export); returns its
    manifest (the record whose :meth:`~evo.runtime.ExportManifest.to_dict` ``manifest.json`` holds).

    Without ``verify``, a shape whose best kernel is not faster than cuBLAS in the archive's GPU
    time is left to cuBLAS (:func:`choose_path`; ``keep_slower`` exports it anyway). With it, the
    top ``verify.top_k`` candidates of every shape are built and re-timed beside cuBLAS, and a
    shape keeps the fastest only where it beats cuBLAS by ``verify.margin`` (``verify.against``)
    (:mod:`evo.export._export_verify`); the manifest records both timings and the decision (``verify``
    per shape; ``verify_why`` says why a re-timing did not run). A kernel nvcc refuses is left
    out too, with nvcc's error; when every kernel fails, or the launchers do not build, nothing
    is. The manifest's ``paths`` says, for every shape of the archive, which path it takes
    (``evolved`` or ``cublas``) and why; ``skipped`` lists the shapes without an exported kernel;
    ``damage`` the archive's damage the caller chose to go on past (what was skipped)."""
    gencode = _gencode(arch)
    out = Path(out).resolve()
    if out.exists() and not (out / MANIFEST_FILE).is_file():
        raise ExportError(f"{out} exists and is not an evo export; refusing to overwrite it")
    archive = Archive(archive_path, "r")  # ArchiveError propagates: the caller reports it
    trials, skipped = _select(archive, arch, keep_slower, verify.top_k if verify else 1, verify is not None)
    with staged_dir(out) as tmp:
        (tmp / "src").mkdir()
        dropped: dict[Shape, list[str]] = {}  # why a trial was left out, per shape
        shapes = list(dict.fromkeys(t.shape for t in trials))
        trials = _write_units(tmp, trials, dropped)
        failed = _compile_units(tmp, [t.unit for t in trials], gencode, jobs)
        if failed and len(failed) == len(trials):
            raise ExportError(next(iter(failed.values())))
        for t in trials:
            if t.unit in failed:
                dropped.setdefault(t.shape, []).append(f"{t.elite.candidate_id}: {failed[t.unit]}")
        trials = [t for t in trials if t.unit not in failed]
        left = {t.shape for t in trials}
        skipped += [{"shape": str(s), "reason": "; ".join(dropped[s])} for s in shapes if s not in left]
        decisions: dict[str, dict[str, Any]] = {}
        if verify is not None and trials:
            kept, decisions = _verified(tmp, trials, gencode, verify, keep_slower)
            for t in trials:
                if t not in kept:
                    for f in (t.unit, t.unit[:-3] + ".o"):
                        (tmp / "src" / f).unlink()
            skipped += [{"shape": s, "reason": d["why"]} for s, d in decisions.items() if d["path"] == "cublas"]
            trials = kept
        entries, prepared_launchers = [], []
        for t in trials:
            unit = (tmp / "src" / t.unit).read_text()
            prepared = t.prepared()
            if prepared:
                prepared_launchers.append(t.prepared_launcher())
            entries.append(_entry(t.shape, t.elite, unit, t.workspace, arch, why=t.why, prepared_b=prepared,
                                  verify=decisions[str(t.shape)] if decisions else None))
        paths = {s["shape"]: {"path": "cublas", "why": s["reason"]} for s in skipped}
        paths.update({e.shape: {"path": "evolved", "why": e.why} for e in entries})
        for s, d in decisions.items():
            paths[s]["verify"] = d
        tn = [t.shape for t in trials if t.shape.layout == "TN"]
        nn = [t.shape for t in trials if t.shape.layout == "NN"]
        launchers = [PRELUDE, *[t.launcher(f"evo_hgemm_{t.shape.key}") for t in trials],
                     *prepared_launchers,
                     dispatcher("evo_hgemm", tn), dispatcher("evo_hgemm_nn", nn)]
        (tmp / "src" / "launchers.cu").write_text("\n".join(launchers))
        _link(tmp / "src", [t.unit[:-3] + ".o" for t in trials], gencode, "launchers.cu", tmp / LIBRARY)
        for o in (tmp / "src").glob("*.o"):
            o.unlink()
        manifest = ExportManifest(
            format=MANIFEST_FORMAT, arch=arch, library=LIBRARY, evo=_evo_version(), archive=archive.path,
            kernels=tuple(entries), skipped=tuple(skipped), paths=paths, damage=tuple(damage),
            test_double=any(from_test_double(e.elite.latest) for e in trials),
            verify=({"ran": True, "timer": verify.name, "top_k": verify.top_k, "margin": verify.margin,
                     "against": verify.against, "confirm": verify.confirm and not keep_slower}
                    if verify is not None else {"ran": False, "why": verify_why or "not asked for"}),
            fallback="every shape not in kernels is cuBLAS's (torch.matmul): the dispatchers return -1",
            abi="int evo_hgemm(const void* A, const void* B, void* C, int M, int N, int K, "
                "void* workspace, cudaStream_t stream); evo_hgemm_nn for NN; 0 = ok, -1 = unknown shape")
        manifest.write(tmp)
    return manifest
