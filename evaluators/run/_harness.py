"""The GPU worker's handler: load a cubin, check it, time it, flag it (cascade steps 3-6).

Runs inside the worker process started by :mod:`evaluators.run._worker` (one per GPU, the GPU it
sees is ``cuda:0``). Buffers and the stream are torch's; kernels go through the loader of
:mod:`evaluators.run._loader` with parameters packed by :mod:`evaluators.run._tmap`.

A job is the wire form of :class:`evaluators._job.Job` (checked with ``Job.from_wire`` on
arrival): ``{"cubin", "plan", "shapes", "generic", "timers", "seed", "qps"}`` plus optional
``elite_threshold`` (the memoisation timing pass runs only when the device speedup reaches it:
below it the candidate cannot become an elite, so a memo would buy it nothing; absent or None:
always), ``memo_check`` (False: never) and ``rotations`` (time the device timer on that many
freshly allocated rotations and report the median of their medians, with each one kept);
``host_timers`` (``"elites"``, the default: the offline and server timers run only where the
device speedup reaches ``elite_threshold``; ``"always"``),
``rounds``, ``budget_s``, ``max_rounds``, ``settle_s``, ``settle_min_s`` and ``prewarm`` tune the
device timer (see :func:`evaluators.run._timers.device_timer`; ``evaluators.PRECISE_JOB`` is the preset for
a measurement that must repeat across worker starts). The
result has ``status``/``message`` for the job and one dict per shape (status, message,
max_error, flags, timers, correctness_s, timing_s, phases (seconds per step), provenance).

Buffers a candidate can reach come from :mod:`evaluators.run._vmm` (worker option ``buffers``:
``"vmm"``, the default, VA reservations with 2 GiB unmapped gaps, so far stores fault (verified
on the H200: `oob_write_far` and the placement cheats caught, red team with no holes); ``"torch"``,
plain allocations with 64 MiB canaries; the default can be overridden by ``EVO_EVAL_BUFFERS``).
A context-poisoning CUDA error sets ``fatal`` and the
worker exits after replying (the context cannot be used again).
"""
from __future__ import annotations

import os
import random
import statistics
import threading
import time
from typing import Any, Callable, Mapping, Optional

import torch

from populations import LaunchPlan, PlanError, Shape, Status

from ._builtin_kernels import EMPTY_KERNEL, NAIVE_GEMM, naive_plan
from ..correctness._correctness import (FP64_LIMIT, Cascade, CheckFailed, Guarded, Operands, RotationReference, large_ragged, ragged_instances,
                           recheck_sets, verify_sets, workspace_fill)
from .._job import Job
from ._loader import get_loader, is_poisoning, nvrtc_cubin
from .._provenance import sm_clock_mhz, static_provenance
from ._lease import timing_lease
from ._timers import Arm, device_timer, host_timer, rotation_sets
from ._tmap import ParamPack, TensorMapError, TmapCache
from ._vmm import TorchAllocator, make_allocator

__all__ = ["make_handler", "GpuHandler", "DEFAULT_CEILINGS", "physical_floor", "memo_flag", "memo_wanted", "MEMO_RATIO"]

#: Ceilings used for the physical-floor flag when the start-up measurement is lower.
DEFAULT_CEILINGS = {"flops": 790e12, "bytes_per_s": 4.3e12, "launch_s": 0.5e-6}
#: Measured rates are what cuBLAS and a copy reach; a kernel may beat them, never the datasheet
#: (H200: ~990 TFLOP/s dense fp16, 4.8 TB/s). Headroom from measured to peak before flagging.
HEADROOM = {"flops": 1.30, "bytes_per_s": 1.15, "launch_s": 0.7}
TIMERS = ("device", "offline", "server")
#: Canary bytes on each side of every operand in the correctness checks: a store up to 64 MiB
#: away from A, B, C or the workspace lands in a canary, not in memory nobody checks.
GUARD_BYTES = 64 << 20
#: Canary bytes per side inside VA-reserved blocks: beyond the block the unmapped gap faults.
VMM_GUARD_BYTES = 1 << 20
#: Canary bytes per side of the timing rotation's stacks and workspaces.
ROTATION_GUARD_BYTES = 64 << 10
#: Default buffer source of the worker (option ``buffers``); see the module docstring.
DEFAULT_BUFFERS = os.environ.get("EVO_EVAL_BUFFERS", "vmm")


#: Clock settling before the device timer's first sample (see ``_timers.device_timer``), at
#: most this many seconds (job option ``settle_s``), and only on a job's first device timing
#: after the worker was idle for ``IDLE_S`` (or at its first job): in a busy run the clock has
#: already settled under load, and the settling would only cost time.
SETTLE_S = 0.5
IDLE_S = 1.0
#: ... and at least this long (job option ``settle_min_s``): an idle H200 holds its boost clock
#: for a while before the power limit pulls it down under a big GEMM.
SETTLE_MIN_S = 0.0


#: The device timer's replays per arm (seconds, rounds at most) for every candidate in a run:
#: 80 samples at 4096^3, 6 at tiny shapes, where one replay calls thousands of kernels.
DEVICE_BUDGET_S, DEVICE_MAX_ROUNDS = 0.05, 40


#: An honest kernel takes the same time whether or not its inputs change between calls (the
#: perturbation is one sign flip outside the timed events); memoisation makes repeats far faster.
MEMO_RATIO = 1.3


def memo_flag(perturbed_s: float, repeated_s: float) -> Optional[str]:
    """A hack flag when repeated identical inputs time much faster than changing ones, else None.

    The device timer changes one input element before every call, so a kernel that caches its
    outputs by input content (a hash of every element is exact, so no output check can catch
    it) gains nothing there; timing it once more on identical inputs shows whether it tries."""
    if repeated_s * MEMO_RATIO < perturbed_s and perturbed_s - repeated_s > 1e-6:
        return (f"faster on repeated identical inputs ({repeated_s * 1e6:.2f} us) than with inputs changed between "
                f"calls ({perturbed_s * 1e6:.2f} us): results memoised across calls")
    return None


def physical_floor(shape: Shape, ceilings: Mapping[str, float]) -> float:
    """Fewest seconds any kernel can take: max(FLOPs/peak, bytes/bandwidth, launch floor)."""
    return max(shape.flops / (ceilings["flops"] * HEADROOM["flops"]),
               shape.min_bytes / (ceilings["bytes_per_s"] * HEADROOM["bytes_per_s"]),
               ceilings["launch_s"] * HEADROOM["launch_s"])


def thread_count() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


class CandidateKernels:
    """A loaded module and a ``call`` that runs a resolved plan on given buffers.

    ``tmaps`` (the worker's :class:`TmapCache`) is shared by every candidate, so the timing
    rotation's tensor maps are encoded once per worker, not once per candidate."""

    def __init__(self, loader: Any, cubin: bytes, plan: LaunchPlan, tmaps: Optional[TmapCache] = None) -> None:
        self.loader, self.plan = loader, plan
        self.module = loader.load(cubin)
        self.fns: dict[tuple[str, int], Any] = {}
        self.layouts: dict[tuple[str, int], Optional[list[tuple[int, int]]]] = {}  # the driver's, per function
        self.tmaps = tmaps if tmaps is not None else TmapCache()

    def bind(self, shape: Shape) -> tuple[Callable[[Mapping[str, int], Optional[torch.Tensor]], None], int, int]:
        """(call(pointers, workspace_tensor), workspace bytes, launches) for ``shape``; raises
        PlanError, or TensorMapError for a tensor map this shape cannot have.

        The plan's arguments are checked against each kernel's parameters as the driver lays them
        out (count and sizes; where the driver can say): a mismatch is a PlanError, not a launch
        that reads garbage.

        Everything that does not depend on the pointers is done here, once: the functions, the
        bound launchers, one :class:`ParamPack` per launch (rewritten in place by every call: the
        driver copies the arguments at launch) and the tensor-map tables. A call then costs the
        raw stream handle, the pointer and tensor-map bytes written into the packs, and the
        launches."""
        launches, ws = self.plan.resolve(shape)
        steps = []
        for ln in launches:
            key = (ln.kernel, ln.smem)
            if key not in self.fns:
                self.fns[key] = self.loader.function(self.module, ln.kernel, ln.smem)
            pack = ParamPack(ln.args)
            if key not in self.layouts:
                self.layouts[key] = self.loader.param_layout(self.fns[key])
            if self.layouts[key] is not None:
                try:
                    pack.check_layout(self.layouts[key])
                except ValueError as exc:
                    raise PlanError(f"launch of {ln.kernel}: {exc}") from None
            tables = tuple((i, self.plan.tensor_maps[name].matrix, self.tmaps.table(self.plan.tensor_maps[name], shape), name)
                           for i, name in enumerate(pack.tmap_names))
            steps.append((self.loader.launcher(self.fns[key], ln.grid, ln.block, ln.smem), pack, pack.pointer_names, tables))
        zero = self.plan.zero_workspace and ws > 0
        stream_of = _raw_stream_getter()

        def call(ptrs: Mapping[str, int], wtensor: Optional[torch.Tensor]) -> None:
            stream = stream_of()
            if zero and wtensor is not None:
                wtensor.zero_()
            for go, pack, names, tables in steps:
                pack.set_pointers([ptrs[n] for n in names])
                for i, matrix, get, name in tables:
                    pack.set_tmap(i, get(ptrs[matrix]), name)
                go(stream, pack)
        return call, ws, len(launches)

    def unload(self) -> None:
        self.loader.unload(self.module)


def _raw_stream_getter() -> Callable[[], int]:
    """The current CUDA stream's raw handle, cheaply: ``torch._C._cuda_getCurrentRawStream``
    (what torch's own generated launchers use; no Stream object built per call), falling back
    to ``torch.cuda.current_stream().cuda_stream`` where that private entry point is missing."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        return lambda: torch.cuda.current_stream().cuda_stream
    index = torch.cuda.current_device()
    return lambda: raw(index)


class GpuHandler:
    """The real worker handler (see :mod:`evaluators.run._worker` for the protocol)."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self.options = dict(options)
        torch.cuda.init()
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
        """Re-measure matmul rate, copy bandwidth and the graph launch floor once per worker."""
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
        results = []
        seed = int(job.get("seed") or int.from_bytes(os.urandom(6), "little"))
        rng = random.Random(seed)
        try:
            for shape in shapes:
                results.append(self._one_shape(kernels, shape, job, phase, rng))
                phase("partial", results[-1])
                if results[-1].get("fatal"):
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
            for r in results:
                if r["status"] in (Status.OK, Status.FLAGGED):
                    r["status"] = Status.FLAGGED
                    r["flags"].append(f"host thread count changed during the run ({threads_before} -> {threads_after})")
        fatal = any(r.get("fatal") for r in results)
        self._last_busy = time.perf_counter()
        return {"status": Status.OK, "message": "", "shapes": results, "load_s": load_s, "seed": seed, "fatal": fatal}

    def _failure(self, exc: BaseException, where: str) -> dict[str, Any]:
        poisoned = is_poisoning(exc) or self.loader.synchronize() is not None
        return {"status": Status.RUNTIME_ERROR, "message": f"{where}: {exc}", "fatal": poisoned}

    def _one_shape(self, kernels: CandidateKernels, shape: Shape, job: Mapping[str, Any],
                   phase: Callable[[str], None], rng: random.Random) -> dict[str, Any]:
        res: dict[str, Any] = {"shape": str(shape), "status": Status.OK, "message": "", "flags": [], "timers": {},
                               "max_error": None, "correctness_s": 0.0, "timing_s": 0.0, "checks": [],
                               "phases": {}}
        phase("correctness")
        stage = "correctness"
        t0 = time.perf_counter()
        gen = torch.Generator(device=self.device).manual_seed(rng.getrandbits(62))
        try:
            instances: list[Shape] = []
            large: Optional[Shape] = None
            if job.get("generic"):
                pitch = {("K" if spec.matrix in ("A",) or (spec.matrix == "B" and shape.layout == "TN") else "N")
                         for spec in kernels.plan.tensor_maps.values()}
                instances = ragged_instances(shape, pitch, rng)
                large = large_ragged(shape, pitch, rng)
                if large != shape:
                    instances.append(large)  # as large a grid as the claim, every tail partial
            ragged_s = 0.0
            for inst in instances + [shape]:
                t_inst = time.perf_counter()
                try:
                    call, ws, _ = kernels.bind(inst)
                except (PlanError, TensorMapError) as exc:
                    return {**res, "status": Status.REJECTED, "message": f"plan does not resolve for {inst}: {exc}"}
                alloc = self._allocator()
                ops = Operands.allocate(inst, ws, kernels.plan.zero_workspace, self.device, gen,
                                        getattr(self, "guard_bytes", GUARD_BYTES), alloc.bytes, movable=True)
                cas = Cascade(ops, lambda o, c=call: c(o.pointers(), o.W.data if o.workspace_bytes else None), self._sync, gen,
                              placements=rng, gapped=bool(alloc.gap_bytes))
                try:
                    if inst is shape:
                        cas.full(bool(job.get("generic")))
                    elif inst is large:  # full-size: one random-input check (every element compared) suffices
                        cas.random()
                    else:
                        cas.smoke()
                        if inst.k >= 4096:
                            cas.all_ones()
                            cas.cancellation()
                except CheckFailed as exc:
                    where = "" if inst is shape else f" on ragged instance {inst.m}x{inst.n}x{inst.k}"
                    return {**res, "status": Status.INCORRECT, "message": f"{exc}{where}", "max_error": exc.max_error,
                            "checks": cas.checks, "correctness_s": time.perf_counter() - t0}
                res["checks"] += cas.checks
                res["max_error"] = max(res["max_error"] or 0.0, cas.max_error)
                del ops
                if inst is not shape:
                    ragged_s += time.perf_counter() - t_inst
            res["correctness_s"] = time.perf_counter() - t0
            res["phases"]["correctness"] = res["correctness_s"]
            if instances:  # of which: the generic candidate's ragged instances (small and full-size)
                res["phases"]["correctness_ragged"] = ragged_s
            if not self._timing_intact():
                return {**res, "status": Status.INCORRECT, "correctness_s": res["correctness_s"],
                        "message": "wrote outside its buffers: the harness's cached timing inputs changed during the checks"}
            phase("timing")
            stage = "timing"
            t1 = time.perf_counter()
            call, ws, n_launches = kernels.bind(shape)
            with timing_lease(res):  # no LLM generation on this GPU while it times (issue 25)
                self._time(call, ws, kernels.plan.zero_workspace, shape, job, rng, gen, res)
            res["timing_s"] = time.perf_counter() - t1
        except CheckFailed as exc:  # outputs wrong after timing
            res["status"], res["message"] = Status.FLAGGED, str(exc)
            res["flags"].append(str(exc))
        except Exception as exc:
            fail = self._failure(exc, stage)
            return {**res, **fail, "correctness_s": res["correctness_s"] or time.perf_counter() - t0}
        res["provenance"] = {"sm_clock_mhz": sm_clock_mhz()}
        # the server timer's gaps (the GPU idles by design), the device timer's warm-up and clock readings
        res["provenance"].update(res.pop("notes", {}))
        return res

    def _allocator(self) -> Any:
        alloc = getattr(self, "alloc", None)
        if alloc is None:  # a handler built without __init__ (CPU tests): plain tensors on its device
            alloc = self.alloc = TorchAllocator(self.device)
        return alloc

    # -- timing -----------------------------------------------------------------------------
    def _buffers(self, shape: Shape, ws: int) -> "TimingBuffers":
        """Rotation buffers and captured baseline graphs, kept for the last two shapes: the
        baseline is still replayed with every candidate, only its capture is reused."""
        key = (shape.m, shape.n, shape.k)
        bufs = self._timing_cache.pop(key, None)
        if bufs is not None and not bufs.intact():  # altered by an earlier job: rebuild
            bufs = None
        if bufs is None:
            while len(self._timing_cache) >= 2:
                self._timing_cache.pop(next(iter(self._timing_cache)))
            torch.cuda.empty_cache()
            bufs = TimingBuffers(shape, ws, self.l2, self.device, self._allocator().bytes)
        self._timing_cache[key] = bufs
        return bufs

    def _inputs_modified(self, tb: "TimingBuffers", res: dict[str, Any], when: str) -> None:
        """The candidate changed its inputs (or a rotation buffer) while timed: incorrect, and the
        cached rotation is dropped so no later candidate or baseline is timed on altered data."""
        for key, other in list(self._timing_cache.items()):
            if other is tb:
                del self._timing_cache[key]
        res["status"] = Status.INCORRECT
        res["message"] = f"modified input {when}: the timing rotation's A/B differ from their pristine copy"
        res["timers"] = {}

    def _timing_intact(self, keep: Optional["TimingBuffers"] = None) -> bool:
        """Check the cached rotations (other than ``keep``) as canaries; drop any that changed."""
        bad = [key for key, tb in self._timing_cache.items() if tb is not keep and not tb.intact()]
        for key in bad:
            del self._timing_cache[key]
        return not bad

    def _time(self, call: Callable, ws: int, zero_ws: bool, shape: Shape, job: Mapping[str, Any],
              rng: random.Random, gen: torch.Generator, res: dict[str, Any]) -> None:
        m, n = shape.m, shape.n
        phases = res.setdefault("phases", {})
        clock = _PhaseClock(phases)
        tb = self._buffers(shape, ws)
        n_sets, a, b_nk, b_kn, cc, cb, cc_all = tb.n_sets, tb.a, tb.b_nk, tb.b_kn, tb.cc, tb.cb, tb.cc_all
        w_guard = Guarded(n_sets, max(ws, 1) + 255 >> 8 << 8, self.device, gen, torch.uint8,
                          guard_bytes=ROTATION_GUARD_BYTES, alloc=self._allocator().bytes)
        w_all = w_guard.data
        w_all.fill_(0 if zero_ws else workspace_fill(rng))
        ptrs = tb.pointers(shape.layout, w_all)
        cc_all.fill_(float("nan"))
        arms = [Arm("candidate", lambda i: call(ptrs[i], w_all[i] if ws else None), n_sets),
                Arm("torch.matmul NN", lambda i: torch.matmul(a[i], b_kn[i], out=cb[i]), n_sets, cacheable=True),
                Arm("torch.matmul TN", lambda i: torch.matmul(a[i], b_nk[i].t(), out=cb[i]), n_sets, cacheable=True)]
        wanted = [t for t in (job.get("timers") or TIMERS) if t in TIMERS]
        clock("setup")
        perturb = _perturber(tb, shape, w_all if ws and not zero_ws else None, rng)
        stats: dict[str, dict[str, Any]] = {}
        kept: dict[str, Any] = {}  # the candidate's one-rotation graph, replayed again below
        try:
            if "device" in wanted:
                idle = time.perf_counter() - self._last_busy > IDLE_S
                settle = float(job.get("settle_s", SETTLE_S)) if idle else 0.0
                settle_min = float(job.get("settle_min_s", SETTLE_MIN_S)) if idle else 0.0
                stats["device"] = device_timer(arms, rng=rng, graph_cache=tb.graphs, perturb=perturb, keep=kept,
                                               settle_s=settle, settle_min_s=settle_min, clock=sm_clock_mhz,
                                               prewarm=bool(job.get("prewarm", True)), stream=self.capture_stream,
                                               **_rounds(job))
                self._last_busy = time.perf_counter()
                clock("device")
                try:
                    _check_timed(kept["candidate"][0], perturb, tb, shape, "timed replays", self._sync, rng)
                except CheckFailed as exc:
                    res["flags"].append(str(exc))
                clock("timed_check")
                dev_st = stats["device"]["candidate"]
                res.setdefault("notes", {})["device_warmup_s"] = dev_st.warmup_s
                res["notes"]["device_capture_s"] = dev_st.capture_s
                res["notes"]["device_prewarm_replays"] = dev_st.prewarm_replays
                if dev_st.clocks:
                    res["notes"]["settle_clocks_mhz"] = list(dev_st.clocks)
            if "device" in stats:
                dev_sp = _speedup(stats["device"])
                gate = host_timers_wanted(job, dev_sp)
                res.setdefault("notes", {})["host_timers"] = gate
                if gate != "run":
                    wanted = [t for t in wanted if t == "device"]
            if "offline" in wanted:
                stats["offline"] = host_timer(arms, calls=int(job.get("host_calls", 20)), rng=rng, perturb=perturb)
                clock("offline")
            if "server" in wanted:
                stats["server"] = host_timer(arms, calls=int(job.get("host_calls", 20)),
                                             qps=float(job.get("qps", 2000.0)), rng=rng, perturb=perturb)
                res.setdefault("notes", {})["server_gaps_s"] = sum(st.idle_s for st in stats["server"].values())
                clock("server")
            self._sync()
        finally:
            tb.unflip()
        if not tb.intact():
            return self._inputs_modified(tb, res, "during timing")
        clock("intact")
        for name, st in stats.items():
            cand = st["candidate"]
            base_name = _baseline(st)
            base = st[base_name]
            res["timers"][name] = {"median": cand.median, "lo": cand.lo, "hi": cand.hi, "baseline_median": base.median,
                                   "baseline_lo": base.lo, "baseline_hi": base.hi, "samples": cand.samples,
                                   "baseline_name": base_name}
        rotations = int(job.get("rotations") or 1)
        if "device" in stats and rotations > 1:
            try:
                self._more_rotations(call, ws, zero_ws, shape, job, rng, gen, rotations, res)
            except CheckFailed as exc:  # a fresh rotation's outputs wrong after (or during) timing
                res["flags"].append(str(exc))
            clock("rotations")
        # -- hack flags ------------------------------------------------------------------
        replay = None
        if "candidate" in kept:  # one replay = every set called once, as the eager loop below would
            graph = kept["candidate"][0]
            replay = graph.replay
        if "device" in stats:
            dev = stats["device"]["candidate"]
            ceil = self.ceilings or DEFAULT_CEILINGS
            floor = physical_floor(shape, ceil)
            res["floor_s"] = floor
            if dev.median < floor:
                res["flags"].append(f"device time {dev.median * 1e6:.2f} us is below the physical floor {floor * 1e6:.2f} us")
            # per replay: host-synchronised time may exceed event time by launch + sync overhead
            # (tens of us), not by half the work: that would be work the events did not see
            if dev.host_median * dev.reps > 1.5 * dev.median * dev.reps + 1e-4:
                res["flags"].append(f"event time {dev.median * 1e6:.2f} us far below host-synchronised time "
                                    f"{dev.host_median * 1e6:.2f} us per call (work outside the timed stream?)")
            memo_why = memo_wanted(job, res["timers"]["device"])
            res["memo_check"] = memo_why
            if memo_why == "run":
                cache = {"candidate": kept["candidate"]} if "candidate" in kept else None
                repeat = Arm("candidate", arms[0].launch, n_sets, cacheable=cache is not None)
                memo = memo_flag(dev.median, device_timer([repeat], rng=rng, rounds=5, graph_cache=cache,
                                                          warmup_s=0.002, stream=self.capture_stream)["candidate"].median)
                if memo:
                    res["flags"].append(memo)
                clock("memo")
        if "device" in stats:  # every set was written by whole rotations: no poison may be left
            left = int(torch.isnan(cc_all[:, :m * n]).sum())
            if left:
                res["flags"].append(f"outputs wrong after timing: {left} elements of the rotated C sets still hold the NaN poison")
        m_, n_, k_ = shape.m, shape.n, shape.k
        a3 = tb.a_all[:, :m_ * k_].view(n_sets, m_, k_)
        b3 = (tb.bnk_all[:, :n_ * k_].view(n_sets, n_, k_) if shape.layout == "TN"
              else tb.bkn_all[:, :k_ * n_].view(n_sets, k_, n_))
        try:
            recheck_sets(a3, b3, cc_all[:, :m_ * n_].view(n_sets, m_, n_), shape.layout,
                         lambda i: call(ptrs[i], w_all[i] if ws else None), self._sync, gen, call_all=replay,
                         base=tb.base_reference())
        except CheckFailed as exc:
            res["flags"].append(str(exc))
        clock("recheck")
        del kept
        if not tb.intact():
            return self._inputs_modified(tb, res, "during the calls after timing")
        if not w_guard.guards_intact():
            res["flags"].append("wrote outside its buffers during timing: a workspace canary changed")
        if not self._timing_intact(keep=tb):
            res["flags"].append("wrote outside its buffers during timing: another cached rotation's inputs changed")
        clock("intact")
        if res["flags"]:
            res["status"] = Status.FLAGGED
            res["message"] = "; ".join(res["flags"])
        self._last_busy = time.perf_counter()
        res["rotation_sets"] = n_sets
        res["rotation_bytes"] = n_sets * 2 * (shape.m * shape.k + shape.n * shape.k + shape.m * shape.n)
        del w_all, w_guard

    def _more_rotations(self, call: Callable, ws: int, zero_ws: bool, shape: Shape, job: Mapping[str, Any],
                        rng: random.Random, gen: torch.Generator, rotations: int, res: dict[str, Any]) -> None:
        """The device timer again on ``rotations - 1`` freshly allocated rotations (each held while
        the next is made, so each lands on other memory); the reported device times become the
        median over all rotations, each kept in ``device_rotations``. Tells placement from noise."""
        first = res["timers"]["device"]
        runs = [{"median": first["median"], "baseline_median": first["baseline_median"]}]
        held = []
        for _ in range(rotations - 1):
            tb = TimingBuffers(shape, ws, self.l2, self.device, self._allocator().bytes)
            held.append(tb)
            w = torch.empty(tb.n_sets, max(ws, 1) + 255 >> 8 << 8, dtype=torch.uint8, device=self.device)
            w.fill_(0 if zero_ws else workspace_fill(rng))
            ptrs = tb.pointers(shape.layout, w)
            tb.cc_all.fill_(float("nan"))
            arms = [Arm("candidate", lambda i, p=ptrs, w=w: call(p[i], w[i] if ws else None), tb.n_sets),
                    Arm("torch.matmul NN", lambda i, t=tb: torch.matmul(t.a[i], t.b_kn[i], out=t.cb[i]), tb.n_sets),
                    Arm("torch.matmul TN", lambda i, t=tb: torch.matmul(t.a[i], t.b_nk[i].t(), out=t.cb[i]), tb.n_sets)]
            perturb = _perturber(tb, shape, w if ws and not zero_ws else None, rng)
            kept: dict[str, Any] = {}
            try:
                st = device_timer(arms, rng=rng, perturb=perturb, keep=kept, stream=self.capture_stream, **_rounds(job))
                _check_timed(kept["candidate"][0], perturb, tb, shape, f"timed replays on rotation {len(runs) + 1}",
                             self._sync, rng)
            finally:
                tb.unflip()
            left = int(torch.isnan(tb.cc_all[:, :shape.m * shape.n]).sum())
            if left:
                raise CheckFailed("outputs after timing", f"rotation {len(runs) + 1}: {left} elements of the "
                                  "rotated C sets still hold the NaN poison")
            base = min(st["torch.matmul NN"].median, st["torch.matmul TN"].median)
            runs.append({"median": st["candidate"].median, "baseline_median": base})
        for key in ("median", "baseline_median"):
            first[key] = statistics.median(r[key] for r in runs)
        res["device_rotations"] = runs
        del held


def _perturber(tb: "TimingBuffers", shape: Shape, workspaces: Optional[torch.Tensor],
               rng: random.Random) -> Callable[[], None]:
    """What runs before every timed replay (outside the timed events): one element of every row
    of every set's A changes sign, at columns drawn at random each time
    (:meth:`TimingBuffers.flip_rows`; a fixed stride is a pattern a kernel can recognise from its
    inputs, and a single changed element left most of C reusable), and a non-zeroed workspace is
    refilled with a byte drawn as for the checked calls
    (:func:`evaluators.correctness._correctness.workspace_fill`), so that nothing a kernel leaves there
    survives to the next call or tells timing from checking."""
    gen = torch.Generator(device=tb.a_all.device).manual_seed(rng.getrandbits(62))

    def perturb() -> None:
        tb.flip_rows(gen)
        if workspaces is not None:
            workspaces.fill_(workspace_fill(rng))
    return perturb


#: The timed-output check verifies this many rows drawn at random (every row changed since the
#: last call: an output kept from it is stale in all of them) on at most ``TIMED_CHECK_SETS``
#: rotation sets drawn at random: which ones is unknown to the kernel, and the reference costs a
#: few percent of a full one at 4096^3 (the recheck after timing, which follows, still verifies
#: every element of every set).
TIMED_CHECK_ROWS, TIMED_CHECK_SETS = 64, 256


def _check_timed(graph: Any, perturb: Callable[[], None], tb: "TimingBuffers", shape: Shape, where: str,
                 sync: Callable[[], None], rng: random.Random) -> None:
    """Verify the outputs of the timed calls: one more replay of the timed graph (every set into
    its own C, after the same random perturbation as every timed replay, with C holding the last
    replay's outputs as it does between timed replays: nothing tells it from the others), then
    random rows of random sets checked against the current inputs. Raises :class:`CheckFailed`
    naming the set."""
    perturb()
    graph.replay()
    sync()
    m, n, k, sets = shape.m, shape.n, shape.k, tb.n_sets
    rows = sorted(rng.sample(range(m), TIMED_CHECK_ROWS)) if m > 4 * TIMED_CHECK_ROWS else list(range(m))
    picked = sorted(rng.sample(range(sets), min(sets, TIMED_CHECK_SETS)))
    dev = tb.a_all.device
    r_idx, s_idx = torch.tensor(rows, device=dev), torch.tensor(picked, device=dev)
    a3 = tb.a_all[:, :m * k].view(sets, m, k).index_select(0, s_idx).index_select(1, r_idx)
    b = tb.bnk_all[:, :n * k].view(sets, n, k) if shape.layout == "TN" else tb.bkn_all[:, :k * n].view(sets, k, n)
    c3 = tb.cc_all[:, :m * n].view(sets, m, n).index_select(0, s_idx).index_select(1, r_idx)
    verify_sets(a3, b.index_select(0, s_idx), c3, shape.layout, "timed calls verified", where,
                "is wrong on a replay of the timed graph (checked calls were right)", set_ids=picked, row_ids=rows)


def _rounds(job: Mapping[str, Any]) -> dict[str, Any]:
    """The device timer's sample count from a job: fixed ``rounds``, or a ``budget_s`` of replays
    per arm within ``max_rounds``."""
    return {"rounds": job.get("rounds"), "budget_s": float(job.get("budget_s", DEVICE_BUDGET_S)),
            "max_rounds": int(job.get("max_rounds", DEVICE_MAX_ROUNDS))}


def memo_wanted(job: Mapping[str, Any], device: Mapping[str, Any]) -> str:
    """Whether the memoisation timing pass runs for this result: ``"run"``, or why not.

    It costs a second device timing, and a memo pays only where it makes the candidate an elite:
    the engine passes ``elite_threshold`` (the speedup the candidate must reach to join the
    elites; the cutoff only rises as the population grows), and below it the pass is skipped."""
    if not job.get("memo_check", True):
        return "off"
    speedup = device["baseline_median"] / device["median"] if device["median"] > 0 else float("inf")
    return _elite_gate(job, speedup)


def host_timers_wanted(job: Mapping[str, Any], device_speedup: float) -> str:
    """Whether the ``offline`` and ``server`` timers run after the device timer: ``"run"``, or why not.

    They are reported, never ranked on (fitness is the device speedup), and they cost a run
    most where the GPU idles: the server timer's gaps are idle by design and the offline timer
    waits on the host. A candidate below the job's ``elite_threshold`` is discarded on its device
    time, so it skips them, as it skips the memo pass; every elite has all three timers. Job
    option ``host_timers``: ``"elites"`` (the default) or ``"always"``."""
    if job.get("host_timers", "elites") == "always":
        return "run"
    return _elite_gate(job, device_speedup)


def _elite_gate(job: Mapping[str, Any], speedup: float) -> str:
    thr = job.get("elite_threshold")
    if thr is None or speedup >= float(thr):
        return "run"
    return f"skipped: speedup {speedup:.3f} below the elite threshold {float(thr):.3f}"


def _baseline(timer_stats: Mapping[str, Any]) -> str:
    """The arm a timer's result is paired with: the faster torch.matmul layout (best of NN/TN)."""
    return min(("torch.matmul NN", "torch.matmul TN"), key=lambda arm: timer_stats[arm].median)


def _speedup(timer_stats: Mapping[str, Any]) -> float:
    """A timer's speedup: its baseline's median over the candidate's."""
    cand = timer_stats["candidate"].median
    return timer_stats[_baseline(timer_stats)].median / cand if cand > 0 else float("inf")


class _PhaseClock:
    """Adds the seconds since the last call to ``phases[name]`` (where the timing step's time goes)."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases, self.t = phases, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now


class TimingBuffers:
    """Rotating input/output sets for one shape (more than 2x L2 in total), filled once from a
    fixed seed so that repeated measurements of a kernel see the same data, plus the captured
    baseline graphs over them. Each stack is a :class:`Guarded` block from ``alloc`` (in the
    worker a VA reservation with unmapped gaps), allocated in a fixed order; its canaries are
    part of :meth:`intact`."""

    SEED = 0x5EED

    def __init__(self, shape: Shape, ws: int, l2: int, device: torch.device,
                 alloc: Optional[Callable[[int], torch.Tensor]] = None) -> None:
        m, n, k = shape.m, shape.n, shape.k
        free, _ = torch.cuda.mem_get_info()
        per_set = 2 * (2 * m * k + 4 * n * k + 2 * m * n) + ws + 6 * 256  # inputs, pristine copies, outputs
        self.n_sets = n_sets = max(2, min(rotation_sets(2 * (m * k + n * k + m * n), l2), int(0.4 * free) // per_set))
        gen = torch.Generator(device=device).manual_seed(self.SEED)
        canary_gen = torch.Generator(device=device).manual_seed(self.SEED + 1)
        self._guards: list[Guarded] = []

        place_rng = random.Random(self.SEED)
        gapped = bool(getattr(getattr(alloc, "__self__", None), "gap_bytes", 0))

        def stack(rows: int, cols: int, aligned: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
            """Inputs start on a 2 MiB boundary (as fresh large allocations do), outputs at a fixed
            pseudo-random offset: over the sets, address bits and alignments of A, B and C vary."""
            stride = -(-rows * cols // 128) * 128  # 256-byte aligned sets
            g = Guarded(n_sets, stride, device, canary_gen, guard_bytes=ROTATION_GUARD_BYTES, alloc=alloc, movable=True)
            g.place(aligned, place_rng, gapped)
            self._guards.append(g)
            flat = g.data
            return flat, [flat[i, :rows * cols].view(rows, cols) for i in range(n_sets)]

        self.a_all, self.a = stack(m, k, True)
        self.a_all.uniform_(-1, 1, generator=gen)
        self.bnk_all, self.b_nk = stack(n, k, True)
        self.bnk_all.uniform_(-1, 1, generator=gen)
        self.bkn_all, self.b_kn = stack(k, n, True)
        for i in range(n_sets):
            self.b_kn[i].copy_(self.b_nk[i].t())
        self.cc_all, self.cc = stack(m, n, False)
        self.cb_all, self.cb = stack(m, n, False)
        self.graphs: dict[str, Any] = {}
        self._inputs = [t.view(torch.int16) for t in (self.a_all[:, :m * k], self.bnk_all[:, :n * k],
                                                      self.bkn_all[:, :k * n])]
        self._pristine = [t.clone() for t in self._inputs]
        self._flipped: set[int] = set()
        self._row_flips: list[torch.Tensor] = []
        self._mk, self._n = (m, k), n
        self._reference: Optional[RotationReference] = None

    def pointers(self, layout: str, workspaces: torch.Tensor) -> list[dict[str, int]]:
        """Every set's A, B (as stored for ``layout``), C and workspace (row ``i`` of
        ``workspaces``) addresses, from each stack's base and row stride (one ``data_ptr`` per
        stack instead of four per set: 4096 sets at tiny shapes)."""
        def rows(t: torch.Tensor) -> list[int]:
            base, step = t.data_ptr(), t.stride(0) * t.element_size()
            return [base + step * i for i in range(self.n_sets)]
        b_all = self.bnk_all if layout == "TN" else self.bkn_all
        return [{"A": a, "B": b, "C": c, "workspace": w}
                for a, b, c, w in zip(rows(self.a_all), rows(b_all), rows(self.cc_all), rows(workspaces))]

    def flip(self, p: int) -> None:
        """Change the sign of element ``p`` of every set's A."""
        self.a_all[:, p].neg_()
        self._flipped ^= {p}

    def flip_rows(self, gen: torch.Generator) -> None:
        """The timers' input perturbation: change the sign of one element in every row of every
        set's A, at a column drawn at random per row and call. Every output element changes, so
        an output kept from an earlier call (C as memory) is stale everywhere, and which element
        of a row changed cannot be found without redoing the row's work."""
        m, k = self._mk
        if getattr(self, "_row_base", None) is None:
            self._row_base = torch.arange(m, device=self.a_all.device) * k
        pos = self._row_base + torch.randint(0, k, (m,), device=self.a_all.device, generator=gen)
        self.a_all[:, pos] = self.a_all[:, pos].neg()
        self._row_flips.append(pos)

    def unflip(self) -> None:
        """Undo every pending :meth:`flip` and :meth:`flip_rows`: the inputs are bit-identical to
        the pristine copy again (sign changes commute and undo themselves)."""
        for p in self._flipped:
            self.a_all[:, p].neg_()
        self._flipped.clear()
        for pos in self._row_flips:
            self.a_all[:, pos] = self.a_all[:, pos].neg()
        self._row_flips.clear()

    def intact(self) -> bool:
        """Bit-exact comparison of the inputs with their pristine copy (after :meth:`unflip`), and
        every stack's canaries: False when a candidate wrote into them, in place (its own A or B)
        or by a far store (the other cached rotations are the harness's other large live
        buffers, so they double as canaries). Every comparison is queued first and read in one
        synchronisation."""
        if self._flipped or self._row_flips:
            return False
        changed = [(t != q).any() for t, q in zip(self._inputs, self._pristine)] + [g.guards_changed() for g in self._guards]
        return not any(torch.stack(changed).tolist())

    def base_reference(self) -> Optional[RotationReference]:
        """The rotation's reference from its pristine copies (:class:`RotationReference`), made at
        the first call and kept with the rotation, so that the recheck after timing does not
        recompute every set's full product for every candidate; None when it would take more
        than :data:`REFERENCE_CACHE_BYTES` (the recheck then computes full products)."""
        if self._reference is None:
            (m, k), n, sets = self._mk, self._n, self.n_sets
            esize = 8 if m * n * k <= FP64_LIMIT else 4
            if sets * m * n * esize > REFERENCE_CACHE_BYTES:
                return None
            self._reference = RotationReference(self._pristine[0].view(torch.float16).view(sets, m, k),
                                                self._pristine[1].view(torch.float16).view(sets, n, k))
        return self._reference


#: Most bytes a rotation's cached reference (:meth:`TimingBuffers.base_reference`) may take.
REFERENCE_CACHE_BYTES = 1 << 30


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
