"""The timing phase of a job (after the correctness cascade passed): the device timer against
torch.matmul over the cached rotation, then, where wanted, the host timers, more rotations, the
hack flags (physical floor, work outside the timed stream, memoisation), the recheck of every
rotated output and the canaries. :class:`TimingPhase` is a part of the worker's handler
(:class:`._harness.GpuHandler`), which supplies the device, the allocator and the stream."""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

import torch

from populations import Shape, Status

from .._job import ShapeDraft
from ..correctness import CheckFailed, recheck_sets, workspace_fill
from .._provenance import sm_clock_mhz
from ._gates import (DEFAULT_CEILINGS, _baseline, _speedup, host_timers_wanted, memo_flag, memo_wanted, physical_floor,
                     race_stop)
from ._rotation import (InputsModified, Perturbation, TimedSamples, TimingBuffers, WorkspaceRows, _check_timed, _perturber,
                        _set_perturber)
from ._timers import Arm, DeviceTiming, device_timer, host_timer

TIMERS = ("device", "offline", "server")

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


class TimingPhase:
    """The handler's timing step and the cached rotations it times on (two shapes kept)."""

    def _buffers(self, shape: Shape, ws: int) -> "TimingBuffers":
        """Rotation buffers and captured baseline graphs, kept for the last two shapes: the
        baseline is still replayed with every candidate, only its capture is reused. The caller
        has just checked every cached rotation (:meth:`_timing_intact`, after the correctness
        checks, the last candidate code run) and dropped any that changed: no second check here
        (it cost a synchronisation and a pass over every input, about 2 ms at 4096^3)."""
        key = (shape.m, shape.n, shape.k)
        bufs = self._timing_cache.pop(key, None)
        if bufs is None:
            while len(self._timing_cache) >= 2:
                self._timing_cache.pop(next(iter(self._timing_cache)))
            torch.cuda.empty_cache()
            bufs = TimingBuffers(shape, ws, self.l2, self.device, self._allocator().bytes)
        self._timing_cache[key] = bufs
        return bufs

    def _inputs_modified(self, tb: "TimingBuffers", res: ShapeDraft, when: str) -> None:
        """The candidate changed its inputs (or a rotation buffer) while timed: incorrect, and the
        cached rotation is dropped so no later candidate or baseline is timed on altered data."""
        for key, other in list(self._timing_cache.items()):
            if other is tb:
                del self._timing_cache[key]
        res.fail(Status.INCORRECT, f"modified input {when}: the timing rotation's A/B differ from their pristine copy",
                 timers={})

    def _timing_intact(self, keep: Optional["TimingBuffers"] = None) -> bool:
        """Check the cached rotations (other than ``keep``) as canaries; drop any that changed."""
        bad = [key for key, tb in self._timing_cache.items() if tb is not keep and not tb.intact()]
        for key in bad:
            del self._timing_cache[key]
        return not bad

    def _time(self, call: Callable, ws: int, zero_ws: bool, shape: Shape, job: Mapping[str, Any],
              rng: random.Random, gen: torch.Generator, res: ShapeDraft) -> None:
        """Time ``call`` at ``shape`` and flag what the figures show; fills ``res`` (timers,
        flags, the measurement's timer details, phases) and marks it incorrect or flagged where the candidate cheated."""
        run = self._timing_setup(call, ws, zero_ws, shape, job, rng, gen, res)
        try:
            self._run_timers(run)
        finally:
            run.tb.unflip()
        if run.modified or not run.tb.intact():
            return self._inputs_modified(run.tb, res, "during timing")
        run.clock("intact")
        _record_timers(run.stats, res)
        rotations = int(job.get("rotations") or 1)
        if "device" in run.stats and rotations > 1:
            try:
                self._more_rotations(call, ws, zero_ws, shape, job, rng, gen, rotations, res)
            except CheckFailed as exc:  # a fresh rotation's outputs wrong after (or during) timing
                res.flags.append(str(exc))
            run.clock("rotations")
        if "device" in run.stats:
            self._device_flags(run)
        return self._after_timing(run)

    def _timing_setup(self, call: Callable, ws: int, zero_ws: bool, shape: Shape, job: Mapping[str, Any],
                      rng: random.Random, gen: torch.Generator, res: ShapeDraft) -> "_Run":
        """The cached rotation, a guarded workspace per set, NaN-poisoned outputs, the three arms
        (the candidate and both torch.matmul layouts) and the perturbation between calls."""
        clock = _PhaseClock(res.phases)
        tb = self._buffers(shape, ws)
        n_sets, a, b_nk, b_kn, cb = tb.n_sets, tb.a, tb.b_nk, tb.b_kn, tb.cb
        w_rows = WorkspaceRows(n_sets, ws, self.device, gen, 0 if zero_ws else workspace_fill(rng), self._allocator().bytes)
        w_all = w_rows.rows
        ptrs = tb.pointers(shape.layout, w_all)
        tb.cc_all.fill_(float("nan"))

        def candidate(i: int) -> None:
            call(ptrs[i], w_all[i] if ws else None)
        arms = [Arm("candidate", candidate, n_sets),
                Arm("torch.matmul NN", lambda i: torch.matmul(a[i], b_kn[i], out=cb[i]), n_sets, cacheable=True),
                Arm("torch.matmul TN", lambda i: torch.matmul(a[i], b_nk[i].t(), out=cb[i]), n_sets, cacheable=True)]
        wanted = [t for t in (job.get("timers") or TIMERS) if t in TIMERS]
        clock("setup")
        refill = None if ws and zero_ws else w_all  # a zeroed workspace is zeroed by the call itself
        perturb = _perturber(tb, shape, refill, rng)
        host_perturb = _set_perturber(tb, shape, refill, rng)  # host timers call single sets: only that one
        return _Run(shape, job, rng, gen, res, clock, tb, w_rows, candidate, arms, wanted, perturb, host_perturb)

    def _run_timers(self, run: "_Run") -> None:
        """The device timer, then (where the gate lets them) the offline and server timers."""
        job, rng, res, wanted = run.job, run.rng, run.res, run.wanted
        if "device" in wanted:
            idle = time.perf_counter() - self._last_busy > IDLE_S
            settle = float(job.get("settle_s", SETTLE_S)) if idle else 0.0
            settle_min = float(job.get("settle_min_s", SETTLE_MIN_S)) if idle else 0.0
            settings = DeviceTiming(settle_s=settle, settle_min_s=settle_min, prewarm=bool(job.get("prewarm", True)),
                                    **_rounds(job))
            samples = TimedSamples(run.tb, run.shape, random.Random(rng.getrandbits(62)))
            run.stats["device"] = device_timer(run.arms, settings=settings, rng=rng, graph_cache=run.tb.graphs,
                                               perturb=run.perturb, keep=run.kept, clock=sm_clock_mhz,
                                               stream=self.capture_stream, on_replay=samples.note,
                                               stop=race_stop(job, run.shape))
            samples.flush()
            self._last_busy = time.perf_counter()
            run.clock("device")
            try:
                samples.check("timed replays")  # random replays of the timing loop itself
                _check_timed(run.kept["candidate"][0], run.perturb, run.tb, run.shape, "timed replays", self._sync, rng)
            except InputsModified:
                run.modified = True
                return
            except CheckFailed as exc:
                res.flags.append(str(exc))
            run.clock("timed_check")
            dev_st = run.stats["device"]["candidate"]
            # of the device phase: the timed rounds' wall time, and the GPU's share of it in the
            # timed replays themselves (the rest: perturbations, host gaps, synchronisations)
            res.phases["device_sample"] = dev_st.sample_s
            res.phases["device_sample_gpu"] = sum(st.events_s for st in run.stats["device"].values())
            # ... and where the rest went (``_timers.LoopCost``): seconds as phases, counts as notes
            loop = dev_st.loop
            for key, value in loop.items():
                if key.endswith("_s"):
                    res.phases["device_sample_" + key[:-2]] = float(value)
            res.note(device_replays=int(loop.get("replays", 0)), device_syncs=int(loop.get("syncs", 0)))
            res.note(device_warmup_s=dev_st.warmup_s, device_capture_s=dev_st.capture_s,
                     device_prewarm_replays=dev_st.prewarm_replays, device_rounds=dev_st.rounds,
                     device_rounds_planned=dev_st.planned)
            if dev_st.clocks:  # clocks: provenance, with the one read after the shape
                res.provenance["settle_clocks_mhz"] = list(dev_st.clocks)
        if "device" in run.stats:
            gate = host_timers_wanted(job, _speedup(run.stats["device"]), run.shape)
            res.note(host_timers=gate)
            if gate != "run":
                wanted = [t for t in wanted if t == "device"]
        calls = int(job.get("host_calls", 20))
        if "offline" in wanted:
            run.stats["offline"] = host_timer(run.arms, calls=calls, rng=rng, perturb_set=run.host_perturb)
            run.clock("offline")
        if "server" in wanted:
            run.stats["server"] = host_timer(run.arms, calls=calls, qps=float(job.get("qps", 2000.0)), rng=rng,
                                             perturb_set=run.host_perturb)
            res.note(server_gaps_s=sum(st.idle_s for st in run.stats["server"].values()))
            run.clock("server")
        self._sync()

    def _device_flags(self, run: "_Run") -> None:
        """Hack flags from the device time: below the physical floor, far below the
        host-synchronised time, or (would-be elites) much faster on repeated identical inputs."""
        res, shape = run.res, run.shape
        dev = run.stats["device"]["candidate"]
        floor = physical_floor(shape, self.ceilings or DEFAULT_CEILINGS)
        res.note(floor_s=floor)
        if dev.median < floor:
            res.flags.append(f"device time {dev.median * 1e6:.2f} us is below the physical floor {floor * 1e6:.2f} us")
        # per replay: host-synchronised time may exceed event time by launch + sync overhead
        # (tens of us), not by half the work: that would be work the events did not see
        if dev.host_median * dev.reps > 1.5 * dev.median * dev.reps + 1e-4:
            res.flags.append(f"event time {dev.median * 1e6:.2f} us far below host-synchronised time "
                                f"{dev.host_median * 1e6:.2f} us per call (work outside the timed stream?)")
        memo_why = memo_wanted(run.job, res.timers["device"], shape)
        res.note(memo_check=memo_why)
        if memo_why == "run":
            cache = {"candidate": run.kept["candidate"]} if "candidate" in run.kept else None
            repeat = Arm("candidate", run.arms[0].launch, run.tb.n_sets, cacheable=cache is not None)
            memo = memo_flag(dev.median, device_timer([repeat], settings=DeviceTiming(rounds=5, warmup_s=0.002), rng=run.rng,
                                                      graph_cache=cache, stream=self.capture_stream)["candidate"].median)
            if memo:
                res.flags.append(memo)
            run.clock("memo")

    def _after_timing(self, run: "_Run") -> None:
        """Every rotated output checked (no NaN poison left, the in-place rechecks of every set),
        then the inputs, the workspace canaries and the other cached rotations; flags make the
        result ``flagged``."""
        res, shape, tb = run.res, run.shape, run.tb
        m, n, k, n_sets = shape.m, shape.n, shape.k, tb.n_sets
        # one replay = every set called once, as the eager loop of the recheck would
        replay = run.kept["candidate"][0].replay if "candidate" in run.kept else None
        if "device" in run.stats:  # every set was written by whole rotations: no poison may be left
            left = int(torch.isnan(tb.cc_all[:, :m * n]).sum())
            if left:
                res.flags.append(f"outputs wrong after timing: {left} elements of the rotated C sets still hold the NaN poison")
        a3 = tb.a_all[:, :m * k].view(n_sets, m, k)
        b3 = tb.bnk_all[:, :n * k].view(n_sets, n, k) if shape.layout == "TN" else tb.bkn_all[:, :k * n].view(n_sets, k, n)
        try:
            recheck_sets(a3, b3, tb.cc_all[:, :m * n].view(n_sets, m, n), shape.layout, run.candidate, self._sync,
                         run.gen, call_all=replay, base=tb.base_reference())
        except CheckFailed as exc:
            res.flags.append(str(exc))
        run.clock("recheck")
        run.kept.clear()
        if not tb.intact():
            return self._inputs_modified(tb, res, "during the calls after timing")
        if not run.w_rows.intact():
            res.flags.append("wrote outside its buffers during timing: a canary around a set's workspace row changed")
        if not self._timing_intact(keep=tb):
            res.flags.append("wrote outside its buffers during timing: another cached rotation's inputs changed")
        run.clock("intact")
        if res.flags:
            res.status, res.message = Status.FLAGGED, "; ".join(res.flags)
        self._last_busy = time.perf_counter()
        res.note(rotation_sets=n_sets, rotation_bytes=n_sets * 2 * (m * k + n * k + m * n))

    def _more_rotations(self, call: Callable, ws: int, zero_ws: bool, shape: Shape, job: Mapping[str, Any],
                        rng: random.Random, gen: torch.Generator, rotations: int, res: ShapeDraft) -> None:
        """The device timer again on ``rotations - 1`` freshly allocated rotations (each held while
        the next is made, so each lands on other memory); the reported device times become the
        median over all rotations, each kept in ``device_rotations``. Tells placement from noise."""
        first = res.timers["device"]
        runs = [{"median": first["median"], "baseline_median": first["baseline_median"]}]
        held = []
        for _ in range(rotations - 1):
            tb = TimingBuffers(shape, ws, self.l2, self.device, self._allocator().bytes)
            held.append(tb)
            w_rows = WorkspaceRows(tb.n_sets, ws, self.device, gen, 0 if zero_ws else workspace_fill(rng))
            w = w_rows.rows
            ptrs = tb.pointers(shape.layout, w)
            tb.cc_all.fill_(float("nan"))
            arms = [Arm("candidate", lambda i, p=ptrs, w=w: call(p[i], w[i] if ws else None), tb.n_sets),
                    Arm("torch.matmul NN", lambda i, t=tb: torch.matmul(t.a[i], t.b_kn[i], out=t.cb[i]), tb.n_sets),
                    Arm("torch.matmul TN", lambda i, t=tb: torch.matmul(t.a[i], t.b_nk[i].t(), out=t.cb[i]), tb.n_sets)]
            perturb = _perturber(tb, shape, None if ws and zero_ws else w, rng)
            kept: dict[str, Any] = {}
            try:
                st = device_timer(arms, settings=DeviceTiming(**_rounds(job)), rng=rng, perturb=perturb, keep=kept,
                                  stream=self.capture_stream)
                _check_timed(kept["candidate"][0], perturb, tb, shape, f"timed replays on rotation {len(runs) + 1}",
                             self._sync, rng)
            finally:
                tb.unflip()
            if not w_rows.intact():
                raise CheckFailed("guard bands", f"rotation {len(runs) + 1}: a canary around a set's workspace row changed")
            left = int(torch.isnan(tb.cc_all[:, :shape.m * shape.n]).sum())
            if left:
                raise CheckFailed("outputs after timing", f"rotation {len(runs) + 1}: {left} elements of the "
                                  "rotated C sets still hold the NaN poison")
            base = min(st["torch.matmul NN"].median, st["torch.matmul TN"].median)
            runs.append({"median": st["candidate"].median, "baseline_median": base})
        for key in ("median", "baseline_median"):
            first[key] = statistics.median(r[key] for r in runs)
        res.note(device_rotations=tuple(runs))
        del held


@dataclass
class _Run:
    """One timing step's state, shared by the steps of :meth:`TimingPhase._time`."""

    shape: Shape
    job: Mapping[str, Any]
    rng: random.Random
    gen: torch.Generator
    res: ShapeDraft
    clock: "_PhaseClock"
    tb: TimingBuffers
    w_rows: WorkspaceRows  # every set's workspace row, canaries between them
    candidate: Callable[[int], None]  # the candidate's call on rotation set i
    arms: list[Arm]
    wanted: list[str]  # the timers the job asks for
    perturb: Perturbation
    host_perturb: Callable[[int], None]  # the same on the one set a host-timed call uses, C not poisoned
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)
    kept: dict[str, Any] = field(default_factory=dict)  # the candidate's one-rotation graph, replayed again
    modified: bool = False  # a timed replay changed its inputs (seen around the checked replay)


def _record_timers(stats: Mapping[str, Mapping[str, Any]], res: ShapeDraft) -> None:
    """Each timer's candidate figures with those of its baseline (the faster torch.matmul layout)."""
    for name, st in stats.items():
        cand = st["candidate"]
        base_name = _baseline(st)
        base = st[base_name]
        res.timers[name] = {"median": cand.median, "lo": cand.lo, "hi": cand.hi, "baseline_median": base.median,
                               "baseline_lo": base.lo, "baseline_hi": base.hi, "samples": cand.samples,
                               "baseline_name": base_name}


def _rounds(job: Mapping[str, Any]) -> dict[str, Any]:
    """The device timer's sample count from a job: fixed ``rounds``, or a ``budget_s`` of replays
    per arm within ``min_rounds``..``max_rounds``."""
    return {"rounds": job.get("rounds"), "budget_s": float(job.get("budget_s", DEVICE_BUDGET_S)),
            "max_rounds": int(job.get("max_rounds", DEVICE_MAX_ROUNDS)), "min_rounds": int(job.get("min_rounds", DeviceTiming.min_rounds))}


class _PhaseClock:
    """Adds the seconds since the last call to ``phases[name]`` (where the timing step's time goes)."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases, self.t = phases, time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.t
        self.t = now
