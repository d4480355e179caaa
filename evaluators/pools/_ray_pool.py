"""RayPool: the LocalPool interface on a Ray cluster (compile tasks on CPUs, one GPU actor per GPU).

``submit(candidate) -> Future[list[Evaluation]]``, ``evaluate``, ``cancel_all``, ``close``, as
:class:`~evaluators.LocalPool`; the engine cannot tell them apart and alone writes the archive
(results come back to the driver process; actors and tasks never touch it).

- Compiles are Ray tasks (``num_cpus=1``), so they run wherever the cluster has free CPUs; each
  still compiles in its own killable child (:func:`~evaluators.compile_candidate`). The driver
  keeps ``compile_workers`` of them running at once.
- One :class:`GpuEvaluator` actor per GPU (``num_gpus=1``, so Ray sets its
  ``CUDA_VISIBLE_DEVICES``). The actor owns a :class:`~evaluators.WorkerSupervisor`, so the
  local isolation holds unchanged: the candidate runs in a spawned child process group with
  per-phase deadlines, a crash or hang kills the child, and the actor restarts and probes it.
- A dead actor (its node lost, ``ray.kill``, out of memory) surfaces as ``RayActorError`` on the
  driver: its slot stops serving (its shapes and queue go to the other actors), its in-flight
  candidate is retried once on another actor (a second loss marks it ``runtime_error`` with a
  message saying so), and a replacement actor is created at once (an idle actor is pinged every
  ``IDLE_CHECK_S``, so a lost node is noticed without work sent there). Ray places it when a GPU is
  free: at once after an actor kill, when the node rejoins after a node loss (capacity comes
  back without a restart of the run); the slot waits for that up to ``reclaim_s`` (default: as
  long as the pool is open). A slot whose actor cannot start its worker is gone for good and
  leaves its work to the others, as LocalPool does with a GPU whose worker cannot start.
- Shards by expected GPU time (issue 23): the engine sends its allocation weights (headroom,
  :meth:`set_shape_weights`), and each shape gets one actor slot so that weight x measured job
  seconds comes out even across the serving actors (``_shard.py``), sticky while that stays
  within ``shard_slack``: a shape that keeps its actor keeps its timing buffers and cuBLAS arms
  cached there (the harness keeps the last two shapes). An idle actor steals the oldest queued
  candidate of the busiest other actor, so the shards never leave a GPU idle.
- Only the driver writes the archive: actors and tasks return records and hold no archive path.

``ray`` is imported only when a RayPool is made; without it :class:`RayUnavailable` says what
to install.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Shape, Status

from ._base import POOLS
from ._pool_core import CorePool, PoolCore, PoolItem, PoolStats
from .._job import EliteThreshold
from ._shard import shape_loads, shard, slot_loads
from ._ray_actor import GpuEvaluator, RayUnavailable, compile_task, connect_ray
from ._ray_slots import ActorSlots, _short
from ..run import DEFAULT_DEADLINES, HARNESS_TARGET, WorkerUnavailable

__all__ = ["RayPool", "RayPoolStats", "RayUnavailable", "GpuEvaluator", "connect_ray"]

@dataclass
class RayPoolStats(PoolStats):
    """PoolStats plus what Ray adds: actors replaced, candidates retried, where compiles ran."""

    actors_replaced: int = 0
    retried: int = 0
    stolen: int = 0                 # items an idle actor took from another actor's queue
    actor_events: list = field(default_factory=list)    # (unix time, slot, "up"|"lost"|"gone", node or why)
    compile_workers: set = field(default_factory=set)   # (node, pid) of the Ray workers that compiled


_IDLE = object()  # RayPool._take: nothing to do for a while


@POOLS.register("ray")
class RayPool(CorePool, ActorSlots):
    """Evaluate candidates on a Ray cluster's GPUs (see the module docstring).

    ``gpus``: how many GPU actors (an int, or a list whose length counts; None: every GPU the
    cluster has). ``address``: see :func:`connect_ray`. ``gpu_per_actor`` is the actor's
    ``num_gpus`` (tests on CPU-only clusters declare logical GPUs with ``ray.init(num_gpus=2)``).
    ``max_retries``: how many times a candidate whose actor died is tried again. ``reclaim_s``:
    how long a slot whose actor died waits for a GPU to place its replacement on (None: while the
    pool is open). ``shard_slack``: how far above the even share a shard may grow before a shape
    moves to another actor.
    """

    #: Seconds an actor may sit idle before its dispatcher checks that it is still alive.
    IDLE_CHECK_S = 2.0

    def __init__(self, gpus: Optional[Sequence[int] | int] = None, compile_workers: int = 4, *,
                 address: Optional[str] = "auto", arch: Optional[str] = None, target: str = HARNESS_TARGET,
                 worker_options: Optional[Mapping[str, Any]] = None, deadlines: Optional[Mapping[str, float]] = None,
                 log_dir: Optional[str] = None, timers: Sequence[str] = ("device", "offline", "server"),
                 qps: float = 2000.0, max_in_flight: Optional[int] = None, cache_dir: Any = None,
                 compile_timeout_s: float = 60.0, compile_fn: Optional[Callable[..., Any]] = None,
                 job_options: Optional[Mapping[str, Any]] = None, gpu_per_actor: float = 1.0,
                 max_retries: int = 1, start_timeout_s: Optional[float] = None,
                 reclaim_s: Optional[float] = None, shard_slack: float = 0.25,
                 init_options: Optional[Mapping[str, Any]] = None) -> None:
        ray = self._ray = connect_ray(address, **dict(init_options or {}))
        if gpus is None:
            gpus = int(ray.cluster_resources().get("GPU", 0) // max(gpu_per_actor, 1e-9)) if gpu_per_actor else 0
        count = gpus if isinstance(gpus, int) else len(list(gpus))
        have = ray.cluster_resources().get("GPU", 0)
        if count < 1 or count * gpu_per_actor > have:
            raise WorkerUnavailable(
                f"the Ray cluster offers {have:g} GPU(s), {count} GPU actor(s) asked for; "
                "join GPU nodes with `ray start --address HEAD:6379`, or ask for fewer" if count >= 1 else
                "the Ray cluster offers no GPU (ray.cluster_resources() lists none); "
                "join GPU nodes with `ray start --address HEAD:6379`")
        self.gpus = list(range(count))  # actor slots; Ray decides which physical GPU each gets
        self.address = address
        # the shared half (PoolCore) compiles through a Ray task that runs the real compile_fn
        self._core = core = PoolCore("RayPool", timers=timers, qps=qps, job_options=job_options,
                                     cache_dir=cache_dir, compile_timeout_s=compile_timeout_s, compile_fn=compile_fn,
                                     slots=max_in_flight or (max(1, compile_workers) + 2 * count),
                                     stats=RayPoolStats(), arch=arch)
        self._task_fn, core.compile_fn = core.compile_fn, self._compile_on_ray
        self.max_retries = max_retries
        self.reclaim_s = reclaim_s
        self.shard_slack = shard_slack
        from .._provenance import code_version

        self.pool_id = uuid.uuid4().hex[:12]  # names this pool's worker pid files on every node
        self._actor_args = (target, {"evo_version": code_version(), **(worker_options or {})}, log_dir, deadlines)
        d = {**DEFAULT_DEADLINES, **(deadlines or {})}
        self.start_timeout_s = start_timeout_s or 3 * (d["startup"] + d["probe"]) + 60.0
        self._actor_cls = ray.remote(GpuEvaluator).options(num_gpus=gpu_per_actor, num_cpus=0, max_restarts=0)
        self._compile_remote = ray.remote(compile_task).options(num_cpus=1, max_retries=2)
        self._lock = core.lock
        self._cv = threading.Condition(self._lock)
        self._queues: list[deque[PoolItem]] = [deque() for _ in self.gpus]
        self._affinity: dict[str, int] = {}   # shape -> slot (its shard)
        self._weights: dict[str, float] = {}  # shape -> the engine's allocation weight
        self._job_s: dict[str, float] = {}    # shape -> seconds a job takes on an actor (moving average)
        self._loads: dict[str, float] = {}    # shape -> expected load, as last sharded
        self._serving: set[int] = set()       # slots with a started actor, taking work
        self._coming: set[int] = set(self.gpus)  # slots whose actor is being placed or started
        self._first: set[int] = set(self.gpus)   # slots that have not served yet (their first start)
        self._restarts_before = 0        # worker restarts counted by actors since replaced
        self._actors: dict[int, Any] = {}
        self._running: dict[int, str] = {}   # slot -> id of the candidate its actor evaluates now
        self._views: dict[int, Any] = {}
        self._compile_pool = ThreadPoolExecutor(max(1, compile_workers), thread_name_prefix="evo-ray-compile")
        self._inputs_done = False
        self._threads = [threading.Thread(target=self._dispatch, args=(slot,), name=f"evo-ray-gpu{slot}", daemon=True)
                         for slot in self.gpus]
        for t in self._threads:
            t.start()

    # -- public -------------------------------------------------------------------------
    def submit(self, candidate: Candidate, *, elite_threshold: EliteThreshold = None) -> "Future[list[Evaluation]]":
        """Queue one candidate; blocks while the pool holds ``max_in_flight`` unfinished ones.
        ``elite_threshold``: as ``LocalPool.submit`` (below it the worker skips its memoisation pass)."""
        item = self._core.admit(candidate, elite_threshold)
        self._compile_pool.submit(self._core.compile, item, self._enqueue)
        return item.future

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Block until no actor is being placed or started; True when every slot serves."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._coming:
                    return self._serving == set(self.gpus)
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)

    def actor(self, slot: int) -> Any:
        """The live actor handle of ``slot`` (None while it is being replaced): for tools and tests."""
        with self._lock:
            return self._actors.get(slot)

    def running(self) -> dict[int, str]:
        """Slot -> id of the candidate its actor is evaluating right now."""
        with self._lock:
            return dict(self._running)

    def placement(self) -> dict[int, dict[str, Any]]:
        """Slot -> where its live actor runs (``ray_node``, ``ray_gpu_ids``, ``ray_actor_pid``)."""
        with self._lock:
            return {slot: dict(view.where) for slot, view in self._views.items() if slot in self._actors}

    def affinity(self) -> dict[str, int]:
        """Shape -> the slot its candidates are queued on (its shard)."""
        with self._lock:
            return dict(self._affinity)

    def serving(self) -> set[int]:
        """The slots whose actor is up and taking work now."""
        with self._lock:
            return set(self._serving)

    def shard_loads(self) -> dict[int, float]:
        """Serving slot -> expected load of its shard (weight x job seconds, summed)."""
        with self._lock:
            return slot_loads(self._affinity, self._loads, sorted(self._serving))

    def set_shape_weights(self, weights: Mapping[Shape, float]) -> None:
        """The engine's allocation weights: re-shard when they changed (see the module docstring)."""
        named = {str(s): float(w) for s, w in weights.items()}
        with self._cv:
            if named == self._weights:
                return
            self._weights = named
            self._reshard_locked()
            self._cv.notify_all()

    def cancel_all(self) -> None:
        """Drop every candidate that has not reached a GPU actor (see ``LocalPool.cancel_all``)."""
        with self._cv:
            self._core.cancelled = True
            dropped = [item for q in self._queues for item in q]
            for q in self._queues:
                q.clear()
            self._cv.notify_all()
        for item in dropped:
            self._core.drop(item)

    def close(self) -> None:
        """Finish queued work (unless cancelled), then stop the actors and their worker children."""
        if self._core.closed:
            return
        self._core.closed = True
        self._compile_pool.shutdown(wait=True)
        with self._cv:
            self._inputs_done = True
            self._cv.notify_all()
        for t in self._threads:
            t.join(timeout=120)
        self._core.stop_results()

    def __enter__(self) -> "RayPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- compiling --------------------------------------------------------------------------
    def _compile_on_ray(self, candidate: Candidate, arch: str, *, timeout_s: float, cache_dir: Any) -> Any:
        """One compile as a Ray task (``PoolCore.compile`` calls this); notes where it ran."""
        res, node, pid = self._ray.get(self._compile_remote.remote(self._task_fn, candidate, arch, timeout_s, cache_dir))
        with self._lock:
            self.stats.compile_workers.add((node, pid))
        return res

    # -- queues, shards and stealing -----------------------------------------------------------
    def _live_locked(self) -> list[int]:
        """Slots new work may be queued on: the serving ones and those starting their first actor
        (the pool's start-up: each gets its shard at once); else the ones whose replacement is
        coming; else every slot (the items then wait or fail in _retire)."""
        return sorted(self._serving | self._first) or sorted(self._coming) or list(self.gpus)

    def _reshard_locked(self) -> None:
        """Give every known shape a slot by expected GPU time (``_shard.shard``), sticky where
        that stays even, and move queued items to their shape's new slot (order kept)."""
        keys = set(self._affinity) | set(self._weights)
        default = 0.0 if self._weights else 1.0  # with the engine's weights, an unnamed shape gets no new work
        loads = shape_loads({k: self._weights.get(k, default) for k in keys}, self._job_s)
        self._affinity = shard(loads, self._live_locked(), self._affinity, self.shard_slack)
        self._loads = loads
        moved: list[PoolItem] = []
        for slot, q in enumerate(self._queues):
            keep = [it for it in q if self._affinity.get(_key(it)) == slot]
            if len(keep) != len(q):
                moved.extend(it for it in q if self._affinity.get(_key(it)) != slot)
                q.clear()
                q.extend(keep)
        for it in moved:
            self._queues[self._slot_for_locked(_key(it))].append(it)

    def _slot_for_locked(self, key: str) -> int:
        """The slot of ``key``'s shape; a shape seen first (or whose slot left) goes to the live
        slot with the least expected load."""
        live = self._live_locked()
        slot = self._affinity.get(key)
        if slot is None or slot not in live:
            have = slot_loads(self._affinity, self._loads, live)
            counts = {s: 0 for s in live}
            for s in self._affinity.values():
                if s in counts:
                    counts[s] += 1
            slot = self._affinity[key] = min(live, key=lambda s: (have[s], counts[s], s))
            self._loads.setdefault(key, 0.0)
        return slot

    def _enqueue(self, item: PoolItem, front: bool = False) -> None:
        """Queue a compiled item on its shape's slot; dropped instead once the pool is cancelled."""
        with self._cv:
            if not self._core.cancelled:
                q = self._queues[self._slot_for_locked(_key(item))]
                (q.appendleft if front else q.append)(item)
                self._cv.notify_all()
                return
        self._core.drop(item)

    def _take(self, slot: int) -> Any:
        """The next item for ``slot``: its own queue first, else the oldest of the longest other
        queue (stealing: affinity never idles an actor); ``_IDLE`` after ``IDLE_CHECK_S`` with
        nothing to do (the dispatcher then checks its actor is alive); None (and the slot stops
        serving) once the pool is closed or cancelled and nothing is queued."""
        idle_until = time.monotonic() + self.IDLE_CHECK_S
        with self._cv:
            while True:
                if self._queues[slot]:
                    return self._queues[slot].popleft()
                longest = max(self._queues, key=len)
                if longest:
                    self.stats.stolen += 1
                    return longest.popleft()
                if self._inputs_done or self._core.cancelled:
                    self._serving.discard(slot)
                    return None
                if time.monotonic() >= idle_until:
                    return _IDLE
                self._cv.wait(0.5)

    # -- one dispatcher thread per GPU actor slot ----------------------------------------------
    def _dispatch(self, slot: int) -> None:
        """Start the slot's actor, feed it until it dies, start another (once capacity is there:
        a node may have to come back first), until the pool closes or the slot is gone."""
        try:
            lost = False
            while True:
                why = self._start_actor(slot, lost)
                if why is not None:
                    self._retire(slot, why)
                    return
                while True:
                    item = self._take(slot)
                    if item is None:
                        return
                    if item is _IDLE:
                        if self._alive(slot):
                            continue
                        self._leave(slot, "found dead while idle (its node lost?)")
                        lost = True
                        break
                    if self._core.cancelled:
                        self._core.drop(item)
                        continue
                    if not self._run(slot, item):
                        lost = True
                        break
        finally:
            self._stop_actor(slot)

    def _run(self, slot: int, item: PoolItem) -> bool:
        """Evaluate ``item`` on ``slot``'s actor; False when the actor is lost (the item is then
        queued again on another slot, or marked when out of retries)."""
        ray, core = self._ray, self._core
        job = core.job(item).to_wire()  # the process boundary: the actor's worker gets the dict
        item.attempts += 1
        t0 = time.monotonic()
        core.job_started(t0)
        with self._lock:
            actor = self._actors[slot]
            self._running[slot] = item.candidate.id
        try:
            out = ray.get(actor.run.remote(job))
        except ray.exceptions.RayActorError as exc:
            self._leave(slot, f"died ({type(exc).__name__})")
            why = f"GPU evaluator actor {slot} died ({type(exc).__name__})"
            if item.attempts <= self.max_retries:
                with self._lock:
                    self.stats.retried += 1
                self._enqueue(item, front=True)
            else:
                core.fail(item, Status.RUNTIME_ERROR, f"{why} while evaluating this candidate (attempt "
                                                      f"{item.attempts} of {self.max_retries + 1}); not retried again")
            return False
        except WorkerUnavailable as exc:  # the actor's fresh worker failed its probes: try another actor
            self._leave(slot, "its worker failed its probes")
            core.fail(item, Status.RUNTIME_ERROR, f"GPU worker unavailable: {_short(exc)}")
            return False
        except Exception as exc:  # an actor-side bug must not strand the future
            out = {"result": {"status": Status.RUNTIME_ERROR, "message": f"evaluator error: {_short(exc)}"}, "pid": None}
        t1 = time.monotonic()
        core.job_ended(slot, t0, t1)
        with self._lock:
            self._running.pop(slot, None)
            key = _key(item)
            old = self._job_s.get(key)
            self._job_s[key] = (t1 - t0) if old is None else 0.8 * old + 0.2 * (t1 - t0)
            view = self._views[slot]
            view.restarts = out.get("restarts", view.restarts)
            self.stats.restarts = self._restarts_before + sum(v.restarts for v in self._views.values())
        sup = SimpleNamespace(gpu=slot, pid=out.get("pid"),
                              info={**view.info, "provenance": {**view.info.get("provenance", {}),
                                                                **view.where, "ray_attempt": item.attempts}})
        core.hand_over(item, out["result"], sup)  # the results thread resolves it; the next job goes out now
        return True


def _key(item: PoolItem) -> str:
    """The shape a queued item is sharded by: the first it claims."""
    return str(item.candidate.shapes[0])
