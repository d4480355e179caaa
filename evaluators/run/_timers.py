"""Timers, each pairing the candidate with the torch.matmul baseline in one process.

Arms are timed interleaved, in a fresh random order every round, so that clock drift and
thermal state hit candidate and baseline alike. The baseline is the faster of torch.matmul on
the NN and TN layouts of the same problem.

- ``device``: each arm's back-to-back launches over rotating buffer sets (more than 2×L2 bytes
  in total, so nothing is served from L2) are captured in one CUDA graph; a sample is one replay
  timed with events, divided by the launches in it. Median and a distribution-free 95%
  confidence interval from order statistics.
- ``offline``: synchronise, one call, synchronise, host clock (CUDA-L2's timer).
- ``server``: ``offline`` with exponential gaps between calls at a target rate.

:func:`replay_medians` is the plain form of ``device`` that ``evo export --verify`` and the LLM
layers benchmark use: each arm's whole rotation captured in one graph (repeated until a replay
lasts about :data:`REPLAY_TARGET_S`), a few warm-up replays, then rounds that replay every arm once
in a fresh random order, timed with events; an arm's time is its median per call.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

import torch

__all__ = ["Arm", "DeviceTiming", "median_ci", "device_timer", "host_timer", "rotation_sets", "TimerStats", "capture",
           "replay_medians", "REPLAY_TARGET_S", "HOST_SYNC_ROUNDS"]


@dataclass
class Arm:
    """Something to time: ``launch(i)`` runs one call on rotation set ``i`` (on the current stream)."""

    name: str
    launch: Callable[[int], None]
    n_sets: int
    cacheable: bool = False  # its captured graph may be reused by later calls (the baselines)


@dataclass
class TimerStats:
    median: float
    lo: float
    hi: float
    samples: int
    host_median: float = 0.0  # device timer: host-synchronised time per call, for the side-stream flag
    reps: int = 1             # device timer: calls per replay (one sample)
    warmup_s: float = 0.0     # device timer: untimed replays before the first sample (clock settling included)
    clocks: tuple = ()        # device timer with a clock: SM MHz read while settling, the last at the first sample
    idle_s: float = 0.0       # server timer: seconds of the gaps before this arm's calls (the GPU idles by design)
    capture_s: float = 0.0    # device timer: host seconds spent capturing the arms' graphs
    prewarm_replays: int = 0  # device timer: warm-up replays of each cached graph queued before the capture
    sample_s: float = 0.0     # device timer: wall seconds of the timed rounds (all arms together)
    events_s: float = 0.0     # device timer: this arm's summed event time over its timed replays (GPU busy)
    rounds: int = 0           # device timer: timed rounds run (fewer than planned when ``stop`` ended them)
    planned: int = 0          # device timer: timed rounds planned
    loop: dict = field(default_factory=dict)  # device timer: where the timed rounds' wall time went (:class:`LoopCost`)


def median_ci(xs: Sequence[float], z: float = 1.96) -> TimerStats:
    """Median with the order-statistic confidence interval (binomial ranks, no distribution assumed)."""
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return TimerStats(0.0, 0.0, 0.0, 0)
    med = s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])
    half = z * math.sqrt(n) / 2
    lo = s[max(0, int(math.floor(n / 2 - half)) - 1)] if n > 1 else s[0]
    hi = s[min(n - 1, int(math.ceil(n / 2 + half)))] if n > 1 else s[0]
    return TimerStats(med, lo, hi, n)


def rotation_sets(set_bytes: int, l2_bytes: int, *, minimum: int = 2, maximum: int = 4096) -> int:
    """How many buffer sets make the rotation exceed twice the L2.

    Capped at ``maximum`` sets (one graph launch each): below about 30 KB per set (problems of
    roughly 64^3 and less) the rotation then stays under 2x L2; the result records its bytes."""
    return max(minimum, min(maximum, math.ceil(2 * l2_bytes / max(1, set_bytes)) + 1))


@dataclass(frozen=True)
class DeviceTiming:
    """How the device timer samples (a job's timing knobs; see :func:`device_timer`).

    ``rounds``: fixed, else as many as spend about ``budget_s`` of replays per arm (``min_rounds``
    to ``max_rounds``; see :func:`sample_rounds`); each round replays every arm ``replays_per_round`` times plus once
    more (host-synchronised in some rounds: :func:`_sample`). ``target_replay_s``: replay length to aim for without a perturbation.
    ``warmup_s``: untimed replays of all arms first. ``settle_s``/``settle_min_s``: clock
    settling after the warm-up (with a ``clock``). ``prewarm``: queue the cached graphs' warm-up
    while the others are captured."""

    rounds: Optional[int] = None
    replays_per_round: int = 1
    target_replay_s: float = 2e-3
    budget_s: float = 0.05
    max_rounds: int = 40
    min_rounds: int = 3
    warmup_s: float = 0.03
    settle_s: float = 0.0
    settle_min_s: float = 0.0
    prewarm: bool = True


def device_timer(arms: Sequence[Arm], *, settings: DeviceTiming = DeviceTiming(), rng: random.Random,
                 graph_cache: Optional[dict] = None, perturb: Optional[Callable[[], None]] = None,
                 keep: Optional[dict] = None, clock: Optional[Callable[[], Optional[int]]] = None,
                 stream: Optional[torch.cuda.Stream] = None,
                 on_replay: Optional[Callable[[str], None]] = None,
                 stop: Optional[Callable[[Mapping[str, Sequence[float]]], bool]] = None) -> dict[str, TimerStats]:
    """CUDA-graph replays of back-to-back calls, interleaved across arms (see module docstring).

    After ``settings.warmup_s`` of untimed replays of all arms, each round replays every arm
    ``replays_per_round + 1`` times, the last of them host-synchronised in
    :data:`HOST_SYNC_ROUNDS` rounds drawn at random (the side-stream flag's samples); by default the number of rounds
    spends about ``budget_s`` of replays per arm (3 to ``max_rounds`` rounds). ``graph_cache`` keeps the
    graphs of ``cacheable`` arms between calls.

    With ``perturb`` (an eager op that changes the inputs, e.g. flips the sign of one element of
    every set's A), a graph holds exactly one rotation, so each set is called once per replay,
    and ``perturb`` runs before every replay, outside the timed events: no call ever sees the
    inputs it saw before, so memoising outputs by input content buys nothing in this timer.

    ``keep`` (a dict) receives ``(graph, calls per replay)`` of every arm, for the caller to
    replay again (the harness's after-timing recheck and memoisation pass: no second capture).

    ``settle_s`` with a ``clock`` (the SM clock in MHz, e.g. NVML's): after the warm-up, keep
    replaying until two readings at least :data:`SETTLE_READ_S` apart are within
    :data:`SETTLE_MHZ` (one clock step) of each other, for at most ``settle_s`` more: a GPU that
    was idle boosts, then drops under load; samples taken while it drops measure the clock's
    trajectory, not the kernel. The readings are returned in ``clocks``; the clock itself is
    never changed. ``settle_min_s``: replay for at least this long before the clock may count
    as settled (an idle GPU first holds its boost clock for a while, then the power limit pulls
    it down; a reading taken before that is not the clock the samples will see).

    ``prewarm``: when some arms' graphs come from ``graph_cache`` and others must be captured,
    the warm-up replays of the cached ones are queued first, so the GPU runs them while the host
    captures (thousands of launches at tiny shapes, GPU-idle time otherwise). The warm-up's
    length is unchanged: it counts from before the capture, and each new graph is replayed at
    least once after it (its upload) before the first sample.

    ``stream``: where graphs are captured (a loader may launch only on streams it made); by
    default a new one.

    ``on_replay(name)``: called before each sampled replay of the arm ``name``, before
    ``perturb`` and outside the timed events (the harness keeps the outputs of random timed
    replays there, to check them after the loop).

    ``stop(per_call)``: racing. After each round from ``settings.min_rounds`` on, it gets every
    arm's seconds per call so far (the replays whose events have completed: no extra
    synchronisation) and may end the timed rounds there (the harness stops a candidate that
    cannot become an elite: :func:`evaluators.run._gates.race_stop`). ``rounds`` and ``planned``
    in the result say how many ran."""
    touch = perturb or (lambda: None)
    graphs, warm_t0, queued, replay_s, capture_s = _graphs(arms, settings, graph_cache, perturb, stream)
    for arm in arms:
        if arm.cacheable and graph_cache is not None:
            graph_cache[arm.name] = graphs[arm.name]
        if keep is not None:
            keep[arm.name] = graphs[arm.name]
    torch.cuda.synchronize()
    if not queued:  # nothing ran during the capture: the whole warm-up comes after it
        warm_t0 = time.perf_counter()
    warm_until = warm_t0 + settings.warmup_s  # steady clocks before the first sample

    def replay_all() -> None:
        for arm in arms:
            touch()
            graphs[arm.name][0].replay()
        torch.cuda.synchronize()
    while time.perf_counter() < warm_until:
        replay_all()
    clocks = (_settle(replay_all, clock, settings.settle_s, settings.settle_min_s)
              if clock is not None and settings.settle_s > 0 else ())
    warmed_s = time.perf_counter() - warm_t0
    rounds = sample_rounds(settings, replay_s)
    t_sample = time.perf_counter()
    race = _Race(graphs, settings.min_rounds, stop) if stop is not None else None
    events, host, done, cost = _sample(arms, graphs, rounds, settings.replays_per_round, rng, perturb, on_replay, race)
    sample_s = time.perf_counter() - t_sample
    loop = cost.summary()
    out = {}
    for arm in arms:
        reps = graphs[arm.name][1]
        replays = [s.elapsed_time(e) * 1e-3 for s, e in events[arm.name]]
        stats = median_ci([t / reps for t in replays])
        stats.sample_s, stats.events_s = sample_s, sum(replays)
        stats.host_median = median_ci(host[arm.name]).median
        stats.reps = reps
        stats.warmup_s, stats.clocks = warmed_s, tuple(clocks)
        stats.capture_s, stats.prewarm_replays = capture_s, queued
        stats.rounds, stats.planned = done, rounds
        stats.loop = dict(loop)
        out[arm.name] = stats
    del graphs
    return out


def sample_rounds(settings: DeviceTiming, replay_s: float) -> int:
    """Timed rounds for replays of about ``replay_s`` seconds: ``settings.rounds`` when fixed, else
    as many as fit ``budget_s`` per arm (a round is ``replays_per_round`` replays plus one
    host-synchronised), clamped to ``min_rounds``..``max_rounds``. ``replay_s`` comes from an eager
    estimate of one call, which a cold clock can inflate several times over; ``min_rounds`` is the
    floor that a precise measurement keeps even then (``evaluators.PRECISE_JOB``)."""
    if settings.rounds is not None:
        return settings.rounds
    fit = round(settings.budget_s / max(replay_s, 1e-6) / (settings.replays_per_round + 1))
    return max(settings.min_rounds, min(settings.max_rounds, fit))


def _graphs(arms: Sequence[Arm], settings: DeviceTiming, graph_cache: Optional[dict],
            perturb: Optional[Callable[[], None]], stream: Optional[torch.cuda.Stream]
            ) -> tuple[dict[str, tuple[torch.cuda.CUDAGraph, int]], float, int, float, float]:
    """Every arm's graph, from ``graph_cache`` or captured (after an estimate of its call time;
    the cached ones' warm-up queued first when ``prewarm``): (graphs with their calls per
    replay, when the warm-up started, prewarm replays queued, longest replay in seconds,
    seconds spent capturing)."""
    stream = stream if stream is not None else torch.cuda.Stream()
    touch = perturb or (lambda: None)
    graphs: dict[str, tuple[torch.cuda.CUDAGraph, int]] = {}
    todo = []
    for arm in arms:
        if arm.cacheable and graph_cache is not None and arm.name in graph_cache:
            graphs[arm.name] = graph_cache[arm.name]
        else:
            todo.append(arm)
    ests = {arm.name: _estimate(arm) for arm in todo}  # eager calls and a sync: before the warm-up is queued
    reps_of = {}
    for arm in todo:
        if perturb is not None:
            reps_of[arm.name] = arm.n_sets
        else:
            reps = max(arm.n_sets, min(4096, math.ceil(settings.target_replay_s / max(ests[arm.name], 1e-7))))
            reps_of[arm.name] = -(-reps // arm.n_sets) * arm.n_sets  # whole rotations: every set written
    warm_t0 = time.perf_counter()  # the warm-up starts here when it is queued before the capture
    cached = [arm for arm in arms if arm.name in graphs]
    queued = 0
    if settings.prewarm and todo and cached:
        per_call = max(ests.values())  # the cached arms' own time is not known here; the new arm's is
        per_round = sum(per_call * graphs[arm.name][1] for arm in cached)
        queued = max(1, min(16, math.ceil(settings.warmup_s / max(per_round, 1e-6))))
        for _ in range(queued):
            for arm in cached:
                touch()
                graphs[arm.name][0].replay()
    replay_s = 0.0
    capture_s = 0.0
    for arm in todo:
        reps = reps_of[arm.name]
        t_cap = time.perf_counter()
        g = capture(lambda: [arm.launch(r % arm.n_sets) for r in range(reps)], stream)
        capture_s += time.perf_counter() - t_cap
        touch()
        g.replay()  # first replay uploads the graph (after the queued warm-up, in stream order)
        graphs[arm.name] = (g, reps)
        replay_s = max(replay_s, ests[arm.name] * reps)
    for arm in arms:  # cached arms count too, so the rounds fit the budget
        replay_s = max(replay_s, 1e-7 * graphs[arm.name][1])
    return graphs, warm_t0, queued, replay_s, capture_s


#: The device timer's host-synchronised replays: in this many rounds per arm, drawn at random
#: (every round when there are fewer). Each one drains the queue (a GPU bubble of the host's
#: next enqueue); ten give the side-stream flag a steady median, and which replays they are is
#: unknown to the kernel as before.
HOST_SYNC_ROUNDS = 10


class _Race:
    """The device timer's early stop (``stop`` of :func:`device_timer`): every arm's seconds per
    call from the event pairs that have completed (a prefix per arm: one stream, in order; each
    pair read once), offered to ``stop`` after every round from ``min_rounds`` on."""

    def __init__(self, graphs: Mapping[str, tuple[torch.cuda.CUDAGraph, int]], min_rounds: int,
                 stop: Callable[[Mapping[str, Sequence[float]]], bool]) -> None:
        self.reps = {name: g[1] for name, g in graphs.items()}
        self.min_rounds, self.stop = max(1, min_rounds), stop
        self.per_call: dict[str, list[float]] = {name: [] for name in graphs}

    def done(self, rounds_run: int, events: Mapping[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]]) -> bool:
        if rounds_run < self.min_rounds:
            return False
        for name, pairs in events.items():
            seen = self.per_call[name]
            while len(seen) < len(pairs) and pairs[len(seen)][1].query():
                start, end = pairs[len(seen)]
                seen.append(start.elapsed_time(end) * 1e-3 / self.reps[name])
        return bool(self.stop(self.per_call))


def _sample(arms: Sequence[Arm], graphs: dict[str, tuple[torch.cuda.CUDAGraph, int]], rounds: int,
            replays_per_round: int, rng: random.Random, perturb: Optional[Callable[[], None]],
            on_replay: Optional[Callable[[str], None]] = None, race: Optional[_Race] = None
            ) -> tuple[dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]], dict[str, list[float]], int, "LoopCost"]:
    """The timed rounds, arms in a fresh random order each: per arm, its event pairs (one per
    replay: ``replays_per_round + 1`` a round) and its host-synchronised seconds per call (one
    per round in :data:`HOST_SYNC_ROUNDS` rounds drawn at random; the round's last replay is
    then synchronised before and after). ``on_replay(name)`` runs before every replay's
    ``perturb`` (see :func:`device_timer`). Events are recorded on the current stream, passed
    explicitly (``Event.record()`` without one looks the stream up, tens of microseconds of
    host time a replay). ``race``: may end the rounds early (see :class:`_Race`); the third
    value returned is the number of rounds run, the fourth the loop's :class:`LoopCost` (the
    perturbation's GPU time timed only where there is one)."""
    stream = torch.cuda.current_stream()
    cost = LoopCost(stream, measure_gpu=perturb is not None)
    touch = perturb or (lambda: None)
    events: dict[str, list[tuple[torch.cuda.Event, torch.cuda.Event]]] = {a.name: [] for a in arms}
    host: dict[str, list[float]] = {a.name: [] for a in arms}
    synced = {a.name: set(rng.sample(range(rounds), min(rounds, HOST_SYNC_ROUNDS))) for a in arms}

    def timed(g: torch.cuda.CUDAGraph) -> tuple[torch.cuda.Event, torch.cuda.Event]:
        t0 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(stream)
        g.replay()
        end.record(stream)
        cost.replay_host_s += time.perf_counter() - t0
        cost.replays += 1
        return start, end

    def before(name: str) -> None:  # the harness's note, then the perturbation, outside the events
        if on_replay is not None:
            t0 = time.perf_counter()
            on_replay(name)
            cost.note_host_s += time.perf_counter() - t0
        cost.perturb(touch)
    for r in range(rounds):
        order = list(arms)
        rng.shuffle(order)
        for arm in order:
            g, reps = graphs[arm.name]
            for _ in range(replays_per_round):
                before(arm.name)
                events[arm.name].append(timed(g))
            before(arm.name)
            if r not in synced[arm.name]:
                events[arm.name].append(timed(g))
                continue
            cost.sync()  # a host-synchronised replay: side streams show here
            t0 = time.perf_counter()
            pair = timed(g)
            cost.sync()
            host[arm.name].append((time.perf_counter() - t0) / reps)
            events[arm.name].append(pair)
        if race is not None and r + 1 < rounds:
            t0 = time.perf_counter()
            stop_now = race.done(r + 1, events)
            cost.race_host_s += time.perf_counter() - t0
            if stop_now:
                rounds = r + 1
                break
    cost.sync()
    return events, host, rounds, cost


class LoopCost:
    """Where the device timer's timed rounds spend their wall time besides the timed replays
    (issue 36: at 4096^3 the rounds took 2.8x their replays' event time and nothing said why).
    Host seconds inside the perturbation (``perturb_host_s``), the harness's per-replay note
    (``note_host_s``), the replay launches with their events (``replay_host_s``), the race's
    check (``race_host_s``) and the synchronisations (``sync_s``: the host blocked while the GPU
    drains its queue, so large when the GPU sets the pace); the perturbation's own GPU time
    (``perturb_gpu_s``, an event pair around each one, outside the timed events; with
    ``measure_gpu`` only); and the counts of replays and synchronisations."""

    def __init__(self, stream: torch.cuda.Stream, measure_gpu: bool) -> None:
        self.stream, self.measure_gpu = stream, measure_gpu
        self.perturb_host_s = self.note_host_s = self.replay_host_s = self.race_host_s = self.sync_s = 0.0
        self.replays = self.syncs = 0
        self._pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def perturb(self, touch: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        if self.measure_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(self.stream)
            touch()
            end.record(self.stream)
            self._pairs.append((start, end))
        else:
            touch()
        self.perturb_host_s += time.perf_counter() - t0

    def sync(self) -> None:
        t0 = time.perf_counter()
        torch.cuda.synchronize()
        self.sync_s += time.perf_counter() - t0
        self.syncs += 1

    def summary(self) -> dict[str, float]:
        """The figures (seconds, and the two counts); call after the last synchronisation."""
        gpu = sum(s.elapsed_time(e) for s, e in self._pairs) * 1e-3
        return {"perturb_host_s": self.perturb_host_s, "perturb_gpu_s": gpu, "note_host_s": self.note_host_s,
                "replay_host_s": self.replay_host_s, "race_host_s": self.race_host_s, "sync_s": self.sync_s,
                "replays": self.replays, "syncs": self.syncs}


#: Clock settling: readings at least this far apart ...
SETTLE_READ_S = 0.02
#: ... within this many MHz of each other (one SM clock step on Hopper) end the settling.
SETTLE_MHZ = 15


def _settle(replay_all: Callable[[], None], clock: Callable[[], Optional[int]], settle_s: float,
            min_s: float = 0.0) -> list[int]:
    """Replay for at least ``min_s``, then until the SM clock holds still, for at most ``settle_s``
    in all (see :func:`device_timer`); the readings taken."""
    first = clock()
    if first is None:
        return []
    readings = [first]
    start = time.perf_counter()
    end = start + max(settle_s, min_s)
    while time.perf_counter() < end:
        read_at = time.perf_counter() + SETTLE_READ_S
        while time.perf_counter() < read_at:
            replay_all()
        now = clock()
        if now is None:
            break
        readings.append(now)
        if abs(now - readings[-2]) <= SETTLE_MHZ and time.perf_counter() - start >= min_s:
            break
    return readings


def capture(fn: Callable[[], object], stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """A CUDA graph of what ``fn`` launches on ``stream``.

    ``torch.cuda.graph`` does the same after a device synchronisation and an ``empty_cache``
    (host and device) on every entry, which only make room for allocations inside the capture:
    with one capture per candidate they released the caching allocator's blocks for the next
    candidate to allocate again. The capture itself is the same (its own private memory pool,
    ``global`` capture error mode, and an error in ``fn`` or at the end propagates as there)."""
    g = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        g.capture_begin()
        try:
            fn()
        finally:
            g.capture_end()
    return g


#: :func:`replay_medians`: a replay is repeated rotations until it lasts about this long (at most 64).
REPLAY_TARGET_S = 3e-4


def replay_medians(arms: Mapping[str, Callable[[int], None]], n_sets: int, *, rounds: int = 7, warmup: int = 2,
                   rng: Optional[random.Random] = None) -> dict[str, float]:
    """Median seconds per call of every arm (``launch(i)`` calls it on rotation set ``i``): see
    the module docstring. Plain medians, no confidence interval, no clock settling: what a
    re-timing of finished kernels against cuBLAS needs."""
    rng = rng or random.Random(0)
    stream = torch.cuda.Stream()
    graphs: dict[str, tuple[torch.cuda.CUDAGraph, int]] = {}
    for name, launch in arms.items():
        probe = _capture_rotation(launch, n_sets, 1, stream)
        one = max(_replay_seconds(probe), 1e-7)
        repeat = max(1, min(64, math.ceil(REPLAY_TARGET_S / one)))
        graphs[name] = (probe, 1) if repeat == 1 else (_capture_rotation(launch, n_sets, repeat, stream), repeat)
        if repeat > 1:
            del probe
    for _ in range(warmup):
        for g, _r in graphs.values():
            g.replay()
    samples: dict[str, list[float]] = {name: [] for name in graphs}
    names = list(graphs)
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            g, repeat = graphs[name]
            samples[name].append(_replay_seconds(g) / (repeat * n_sets))
    del graphs
    return {name: median_ci(xs).median for name, xs in samples.items()}


def _capture_rotation(launch: Callable[[int], None], n_sets: int, repeat: int,
                      stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    """One graph of ``repeat`` rotations over the sets, after a warm call outside the capture (lazy
    init, cuBLAS handles and workspaces), replayed once (its upload)."""
    with torch.cuda.stream(stream):
        launch(0)
    torch.cuda.synchronize()
    g = capture(lambda: [launch(i) for _ in range(repeat) for i in range(n_sets)], stream)
    g.replay()
    torch.cuda.synchronize()
    return g


def _replay_seconds(g: torch.cuda.CUDAGraph) -> float:
    """Seconds of one replay of ``g``, timed with events."""
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    g.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) * 1e-3


def host_timer(arms: Sequence[Arm], *, calls: int = 20, qps: float = 0.0, rng: random.Random,
               perturb: Optional[Callable[[], None]] = None,
               perturb_set: Optional[Callable[[int], None]] = None) -> dict[str, TimerStats]:
    """``offline`` (qps=0) or ``server`` (exponential gaps at ``qps``): sync, call, sync, host clock.
    ``perturb`` runs before each call, outside the timed window (see :func:`device_timer`);
    ``perturb_set(i)`` too, told the set ``i`` the call is about to use (the harness perturbs
    that set alone: :func:`._rotation._set_perturber`)."""
    samples: dict[str, list[float]] = {a.name: [] for a in arms}
    pos = {a.name: 0 for a in arms}
    gaps = {a.name: 0.0 for a in arms}
    for _ in range(calls):
        order = list(arms)
        rng.shuffle(order)
        for arm in order:
            if qps > 0:
                t_gap = time.perf_counter()
                _sleep(rng.expovariate(qps))
                gaps[arm.name] += time.perf_counter() - t_gap
            if perturb is not None:
                perturb()
            if perturb_set is not None:
                perturb_set(pos[arm.name] % arm.n_sets)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            arm.launch(pos[arm.name] % arm.n_sets)
            torch.cuda.synchronize()
            samples[arm.name].append(time.perf_counter() - t0)
            pos[arm.name] += 1
    out = {name: median_ci(xs) for name, xs in samples.items()}
    for name, st in out.items():
        st.idle_s = gaps[name]
    return out


def _estimate(arm: Arm, calls: int = 3) -> float:
    """Rough seconds per call, from a few eager calls (also the warm-up)."""
    arm.launch(0)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(calls):
        arm.launch(i % arm.n_sets)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1e-3 / calls


def _sleep(seconds: float) -> None:
    """Sleep precisely: the OS for the bulk, a spin for the last 200 µs."""
    end = time.perf_counter() + seconds
    if seconds > 3e-4:
        time.sleep(seconds - 2e-4)
    while time.perf_counter() < end:
        pass
