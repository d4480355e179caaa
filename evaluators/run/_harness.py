"""The GPU worker's handler: load a cubin, check it, time it, flag it (cascade steps 3-6).

Runs inside the worker process started by :mod:`evaluators.run._worker` (one per GPU, the GPU it
sees is ``cuda:0``). Buffers and the stream are torch's; kernels go through the loader of
:mod:`evaluators.run._loader` with parameters packed by :mod:`evaluators.run._tmap`.

A job is the wire form of :class:`evaluators._job.Job` (checked with ``Job.from_wire`` on
arrival): ``{"cubin", "plan", "shapes", "generic", "timers", "seed", "qps"}`` plus optional
``elite_threshold`` (the memoisation timing pass runs only when the device speedup reaches it:
below it the candidate cannot become an elite, so a memo would buy it nothing; absent or None:
always), ``memo_check`` (False: never), ``race`` (False: the device timer never stops a
candidate early; by default it stops one that cannot reach ``elite_threshold``: see
:func:`evaluators.run._gates.race_stop`) and ``rotations`` (time the device timer on that many
freshly allocated rotations and report the median of their medians, with each one kept);
``host_timers`` (``"elites"``, the default: the offline and server timers run only where the
device speedup reaches ``elite_threshold``; ``"always"``),
``rounds``, ``budget_s``, ``max_rounds``, ``min_rounds``, ``settle_s``, ``settle_min_s`` and ``prewarm`` tune the
device timer (see :func:`evaluators.run._timers.device_timer`; ``evaluators.PRECISE_JOB`` is the preset for
a measurement that must repeat across worker starts). The
result has ``status``/``message`` for the job and one dict per shape, the wire form of a
:class:`evaluators.ShapeResult` built from a :class:`evaluators.ShapeDraft` (status, message,
max_error, flags, timers, correctness_s, timing_s, the clocks as provenance, and the
:class:`populations.Measurement`'s keys: checks, phases, rotations, the timers' details).

Buffers a candidate can reach come from :mod:`evaluators.run._vmm` (worker option ``buffers``:
``"vmm"``, the default, VA reservations with 2 GiB unmapped gaps, so far stores fault (verified
on the H200: `oob_write_far` and the placement cheats caught, red team with no holes); ``"torch"``,
plain allocations with 64 MiB canaries; the default can be overridden by ``EVO_EVAL_BUFFERS``).
A context-poisoning CUDA error sets ``fatal`` and the
worker exits after replying (the context cannot be used again).

The phases, one module each: load and bind (:mod:`._kernels`), correctness (here, with the cascade
of :mod:`evaluators.correctness`), timing (:mod:`._timing`, over the rotation of :mod:`._rotation`,
its flags and gates in :mod:`._gates`), and the per-shape result built here.
"""
from __future__ import annotations

import os
import random
import threading
import time
from typing import Any, Callable, Mapping, Optional

import torch

from populations import LaunchPlan, PlanError, Shape, Status

from .._job import Job, ShapeDraft, ShapeResult
from .._provenance import sm_clock_mhz, static_provenance
from ..correctness import (CheckFailed, Cascade, CoverItem, Operands, beyond_claim, check_cover, class_cover, large_ragged,
                           ragged_instances)
from ._builtin_kernels import EMPTY_KERNEL, NAIVE_GEMM, naive_plan
from ._gates import DEFAULT_CEILINGS
from ._kernels import CandidateKernels
from ._lease import timing_lease
from ._loader import get_loader, is_poisoning, nvrtc_cubin
from ._rotation import TimingBuffers
from ._timing import TimingPhase
from ._tmap import ParamPack, TensorMapError, TmapCache
from ._vmm import TorchAllocator, make_allocator

__all__ = ["make_handler", "GpuHandler"]

#: Canary bytes on each side of every operand in the correctness checks: a store up to 64 MiB
#: away from A, B, C or the workspace lands in a canary, not in memory nobody checks.
GUARD_BYTES = 64 << 20
#: Canary bytes per side inside VA-reserved blocks: beyond the block the unmapped gap faults.
VMM_GUARD_BYTES = 1 << 20
#: Default buffer source of the worker (option ``buffers``); see the module docstring.
DEFAULT_BUFFERS = os.environ.get("EVO_EVAL_BUFFERS", "vmm")


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def start_cpu_pool() -> None:
    """Start torch's intra-op CPU thread pool now. torch starts it lazily, at the first host op
    big enough to split across threads; a job whose checks made that op (an index or a reference
    on the host) grew the thread count by the pool's size and was flagged as a kernel that
    started host threads (an honest generic kernel, on a 16-core machine: 19 -> 34)."""
    torch.ones(1 << 20).add_(1.0)


class GpuHandler(TimingPhase):
    """The real worker handler (see :mod:`evaluators.run._worker` for the protocol)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        torch.cuda.init()
        start_cpu_pool()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.device = torch.device("cuda", 0)
        torch.cuda.set_device(self.device)
        self.loader = get_loader(self.options.get("loader", "driver"))
        self.provenance = static_provenance()
        major, minor = torch.cuda.get_device_capability(0)
        self.arch = "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
        self.l2 = int(self.provenance.get("l2_bytes") or 60 << 20)
        self._timing_cache: dict[tuple[int, int, int], TimingBuffers] = {}
        self.alloc = make_allocator(str(self.options.get("buffers") or DEFAULT_BUFFERS))
        self.guard_bytes = VMM_GUARD_BYTES if self.alloc.gap_bytes else GUARD_BYTES
        self.provenance["buffers"] = self.alloc.stats()
        if self.options.get("evo_version"):
            self.provenance["evo"] = self.options["evo_version"]
        self.tmaps = TmapCache()  # shared by every candidate: the rotation's maps are encoded once
        self._last_busy = float("-inf")  # end of the last GPU work: a job after an idle spell settles the clock
        raw = self.loader.capture_stream()  # a stream the loader can launch on, for every graph capture
        self.capture_stream = torch.cuda.ExternalStream(raw) if raw else torch.cuda.Stream()
        self._probe_kernels = CandidateKernels(self.loader, nvrtc_cubin(NAIVE_GEMM, self.arch), naive_plan(), self.tmaps)
        self.ceilings = self._measure_ceilings() if self.options.get("measure_ceilings", True) else {}
        probe = self._probe()  # also the warm-up: module load, launches, graph capture, cuBLAS handles
        if probe["status"] != Status.OK:
            raise RuntimeError(f"start-up probe failed: {probe['message']}")
        self.provenance.update(ceilings=self.ceilings)

    def info(self) -> dict[str, Any]:
        return {"arch": self.arch, "provenance": self.provenance, "ceilings": self.ceilings,
                "loader": self.loader.name, "pid": os.getpid(), "buffers": self.alloc.stats()}

    # -- start-up ------------------------------------------------------------------------
    def _measure_ceilings(self) -> dict[str, float]:
        """Re-measure matmul rate, copy bandwidth and the graph launch floor once per worker.

        These feed the physical-floor hack flag, and they are deliberately not the archive's
        calibration (``_calibrate.py``, which the roofline fractions use): the flag must hold on
        the GPU this worker runs on, today, whatever file an archive carries. A calibration from
        another card, an older driver or a hand-edited file could set the floor too low (a faked
        time passes) or too high (an honest kernel is flagged). The higher rate (and the lower
        launch floor) of measured and DEFAULT_CEILINGS is kept, so a slow start-up measurement
        (a GPU busy with something else) cannot raise the floor and flag honest kernels."""
        out = dict(DEFAULT_CEILINGS)
        measured: dict[str, float] = {}
        n = 8192
        a = torch.randn(n, n, device=self.device, dtype=torch.float16)
        b = torch.randn(n, n, device=self.device, dtype=torch.float16)
        for _ in range(3):
            torch.matmul(a, b)
        t = _event_time(lambda: torch.matmul(a, b), 10)
        measured["flops"] = 2 * n ** 3 / t
        del a, b
        src = torch.empty(1 << 29, dtype=torch.uint8, device=self.device).random_(0, 256)
        dst = torch.empty_like(src)
        dst.copy_(src)
        t = _event_time(lambda: dst.copy_(src), 10)
        measured["bytes_per_s"] = 2 * src.numel() / t
        del src, dst
        fn = self.loader.function(self._probe_kernels.module, EMPTY_KERNEL, 0)
        pack = ParamPack((), {}, {})
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.capture_stream):
            for _ in range(1000):
                self.loader.launch(fn, (1, 1, 1), (32, 1, 1), 0, torch.cuda.current_stream().cuda_stream, pack)
        g.replay()
        measured["launch_s"] = _event_time(g.replay, 5) / 1000
        torch.cuda.synchronize()
        for key in ("flops", "bytes_per_s"):
            out[key] = max(out[key], measured[key])
        out["launch_s"] = min(out["launch_s"], measured["launch_s"])
        out.update({f"measured_{k}": v for k, v in measured.items()})
        return out

    # -- probe ------------------------------------------------------------------------------
    def _probe(self) -> dict[str, Any]:
        """Known-good tiny kernel + small GEMM check + a tiny graph capture."""
        try:
            shape = Shape(64, 48, 40, "TN")
            call, ws, _ = self._probe_kernels.bind(shape)
            gen = torch.Generator(device=self.device).manual_seed(1234)
            ops = Operands.allocate(shape, ws, False, self.device, gen, None, self.alloc.bytes)
            cas = Cascade(ops, lambda o: call(o.pointers(), None), self._sync, gen)
            cas.random()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=self.capture_stream):
                call(ops.pointers(), None)
                torch.matmul(ops.A.data, ops.B.data.t())
            g.replay()
            torch.cuda.synchronize()
            return {"status": Status.OK, "message": "probe passed", "threads": thread_count()}
        except Exception as exc:  # a failed probe: the supervisor restarts us
            return {"status": Status.RUNTIME_ERROR, "message": f"probe failed: {exc!r}", "fatal": True}

    def _sync(self) -> None:
        err = self.loader.synchronize()
        if err is not None:
            raise err

    # -- jobs -------------------------------------------------------------------------------
    def handle(self, kind: str, job: Mapping[str, Any], phase: Callable[[str], None]) -> dict[str, Any]:
        if kind == "probe":
            return self._probe()
        threads_before = thread_count()
        self._allocator().trim()  # between jobs: unmap idle blocks beyond the keep limit
        phase("load")
        t0 = time.perf_counter()
        try:
            Job.from_wire(job)  # the pool's Job, checked on this side of the boundary (an unknown key is refused)
            plan = LaunchPlan.from_dict(job["plan"])
            kernels = CandidateKernels(self.loader, job["cubin"], plan, self.tmaps)
        except Exception as exc:
            return self._failure(exc, "load")
        load_s = time.perf_counter() - t0
        shapes = [Shape.parse(s) for s in job["shapes"]]
        results: list[ShapeResult] = []
        seed = int(job.get("seed") or int.from_bytes(os.urandom(6), "little"))
        rng = random.Random(seed)
        try:
            for shape in shapes:
                results.append(self._one_shape(kernels, shape, job, phase, rng).build())
                phase("partial", results[-1].to_wire())  # the pipe: the record goes as its wire dict
                if results[-1].fatal:
                    break
        except Exception as exc:  # a CUDA error outside the per-shape handling
            return self._failure(exc, "shape")
        finally:
            try:
                kernels.unload()
            except Exception:
                pass
        threads_after = thread_count()
        if threads_after > threads_before:
            why = f"host thread count changed during the run ({threads_before} -> {threads_after})"
            results = [r.flagged(why) for r in results]
        fatal = any(r.fatal for r in results)
        self._last_busy = time.perf_counter()
        return {"status": Status.OK, "message": "", "shapes": [r.to_wire() for r in results], "load_s": load_s,
                "seed": seed, "fatal": fatal}

    def _failure(self, exc: BaseException, where: str) -> dict[str, Any]:
        poisoned = is_poisoning(exc) or self.loader.synchronize() is not None
        return {"status": Status.RUNTIME_ERROR, "message": f"{where}: {exc}", "fatal": poisoned}

    def _one_shape(self, kernels: CandidateKernels, shape: Shape, job: Mapping[str, Any],
                   phase: Callable[[str], None], rng: random.Random) -> ShapeDraft:
        """Correctness, then timing, of one claimed shape: the draft the phases fill in (which
        :meth:`handle` freezes into a :class:`ShapeResult`)."""
        res = ShapeDraft(shape)
        phase("correctness")
        stage = "correctness"
        t0 = time.perf_counter()
        gen = torch.Generator(device=self.device).manual_seed(rng.getrandbits(62))
        try:
            instances: list[Shape] = []
            cover: list[Shape] = []  # the class cover, checked together (correctness/_cover.py)
            large: tuple[Shape, ...] = ()  # one random-input check each (every element compared)
            past: Optional[Shape] = None  # the generic claim's instance past the claimed size
            if job.get("generic"):
                # dimensions a tensor map uses as a row pitch in place (a staged copy has its own)
                pitch = {("K" if spec.matrix in ("A",) or (spec.matrix == "B" and shape.layout == "TN") else "N")
                         for spec in kernels.plan.tensor_maps.values() if not spec.staged}
                instances = ragged_instances(shape, pitch, rng)  # smoke checks (docs: correctness/_instances.py)
                # every aligned/ragged class of M, N, K at small and mid sizes, as large a grid as the
                # claim with every tail partial, and past the claim (a generic claim admits it)
                tails_cut = large_ragged(shape, pitch, rng)
                past = beyond_claim(shape, pitch, rng)
                cover = [s for s in class_cover(shape, pitch, rng) if s not in instances and s != shape]
                large = (tails_cut, past)
                if not getattr(self._allocator(), "gap_bytes", 0):  # no fenced block for them all: one by one
                    large, cover = tuple(cover) + large, []
                instances += [s for s in large if s != shape]
            ragged_s = 0.0
            if cover:
                t_cover = time.perf_counter()
                failed = self._check_cover(kernels, cover, gen, rng, res)
                if failed is not None:
                    failed.correctness_s = time.perf_counter() - t0
                    return failed
                ragged_s += time.perf_counter() - t_cover
            for inst in instances + [shape]:
                t_inst = time.perf_counter()
                try:
                    call, ws, _ = kernels.bind(inst)
                except (PlanError, TensorMapError) as exc:
                    if inst is past:  # past the claim: a size the plan refuses is one the claim does not admit
                        res.note(checks=res.measurement.checks + ("beyond_claim_not_admitted",))
                        continue
                    return res.fail(Status.REJECTED, f"plan does not resolve for {inst}: {exc}")
                alloc = self._allocator()
                ops = Operands.allocate(inst, ws, kernels.plan.zero_workspace, self.device, gen,
                                        getattr(self, "guard_bytes", GUARD_BYTES), alloc.bytes, movable=True)
                cas = Cascade(ops, lambda o, c=call: c(o.pointers(), o.W.data if o.workspace_bytes else None), self._sync, gen,
                              placements=rng, gapped=bool(alloc.gap_bytes))
                try:
                    if inst is shape:
                        cas.full(bool(job.get("generic")))
                    elif any(inst is s for s in large):  # one random-input check (every element compared) suffices
                        cas.random()
                    else:
                        cas.smoke()
                        if inst.k >= 4096:
                            cas.all_ones()
                            cas.cancellation()
                except CheckFailed as exc:
                    where = "" if inst is shape else f" on ragged instance {inst.m}x{inst.n}x{inst.k}"
                    return res.fail(Status.INCORRECT, f"{exc}{where}", max_error=exc.max_error, checks=tuple(cas.checks),
                                    correctness_s=time.perf_counter() - t0)
                res.note(checks=res.measurement.checks + tuple(cas.checks))
                res.max_error = max(res.max_error or 0.0, cas.max_error)
                del ops
                if inst is not shape:
                    ragged_s += time.perf_counter() - t_inst
            res.correctness_s = time.perf_counter() - t0
            res.phases["correctness"] = res.correctness_s
            if instances:  # of which: the generic candidate's ragged instances (small and full-size)
                res.phases["correctness_ragged"] = ragged_s
            if not self._timing_intact():
                return res.fail(Status.INCORRECT,
                                "wrote outside its buffers: the harness's cached timing inputs changed during the checks")
            phase("timing")
            stage = "timing"
            t1 = time.perf_counter()
            call, ws, n_launches = kernels.bind(shape)
            with timing_lease() as wait:  # no LLM generation on this GPU while it times (issue 25)
                if wait.enabled:
                    res.note(gpu_lease=wait.to_dict())
                self._time(call, ws, kernels.plan.zero_workspace, shape, job, rng, gen, res)
            res.timing_s = time.perf_counter() - t1
        except CheckFailed as exc:  # outputs wrong after timing
            res.status, res.message = Status.FLAGGED, str(exc)
            res.flags.append(str(exc))
        except Exception as exc:
            fail = self._failure(exc, stage)
            return res.fail(fail["status"], fail["message"], fatal=fail["fatal"],
                            correctness_s=res.correctness_s or time.perf_counter() - t0)
        res.provenance["sm_clock_mhz"] = sm_clock_mhz()  # the clock after the shape's timing
        return res

    def _check_cover(self, kernels: CandidateKernels, cover: list[Shape], gen: torch.Generator,
                     rng: random.Random, res: ShapeDraft) -> Optional[ShapeDraft]:
        """The class-cover instances' random-input checks together, in one fenced block
        (:func:`evaluators.correctness.check_cover`); the failed draft, or None when all pass."""
        items = []
        for inst in cover:
            try:
                call, ws, _ = kernels.bind(inst)
            except (PlanError, TensorMapError) as exc:
                return res.fail(Status.REJECTED, f"plan does not resolve for {inst}: {exc}")
            items.append(CoverItem(inst, ws, lambda o, c=call: c(o.pointers(), o.W.data if o.workspace_bytes else None)))
        alloc = self._allocator()
        try:
            got = check_cover(items, kernels.plan.zero_workspace, self.device, gen, rng, self._sync,
                              getattr(self, "guard_bytes", VMM_GUARD_BYTES), alloc.bytes)
        except CheckFailed as exc:
            return res.fail(Status.INCORRECT, str(exc), max_error=exc.max_error, checks=res.measurement.checks)
        res.note(checks=res.measurement.checks + got.checks)
        res.max_error = max(res.max_error or 0.0, got.max_error)
        return None

    def _allocator(self) -> Any:
        alloc = getattr(self, "alloc", None)
        if alloc is None:  # a handler built without __init__ (CPU tests): plain tensors on its device
            alloc = self.alloc = TorchAllocator(self.device)
        return alloc

def _event_time(fn: Callable[[], Any], reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / reps


def make_handler(options: Mapping[str, Any]) -> GpuHandler:
    return GpuHandler(options)
