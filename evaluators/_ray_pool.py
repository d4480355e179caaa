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
  driver: the actor is replaced (started and probed afresh) and its in-flight candidate is
  retried once on whichever actor is free; a second loss marks it ``runtime_error`` with a
  message saying so. A slot whose replacement cannot start stops taking work and leaves it to
  the other actors, as LocalPool does with a GPU whose worker cannot start.
- Shape affinity: each shape is assigned to one actor (the one with the fewest shapes), so a
  population's candidates meet the same worker, whose timing buffers and cuBLAS arms for that
  shape stay cached (the harness keeps the last two shapes). An idle actor steals the oldest
  queued candidate of the busiest other actor, so affinity never leaves a GPU idle.

``ray`` is imported only when a RayPool is made; without it :class:`RayUnavailable` says what
to install.
"""
from __future__ import annotations

import os
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Status

from ._base import EvaluatorPool
from ._pool_core import PoolCore, PoolItem, PoolStats
from ._worker import DEFAULT_DEADLINES, HARNESS_TARGET, WorkerSupervisor, WorkerUnavailable

__all__ = ["RayPool", "RayPoolStats", "RayUnavailable", "GpuEvaluator", "connect_ray"]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # where `evaluators` lives


class RayUnavailable(ImportError):
    """Ray is not installed, or the cluster named cannot be reached."""


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RayUnavailable("the Ray evaluator pool needs the ray package: "
                             "python -m pip install -e '.[ray]' (or pip install 'ray>=2.40')") from exc
    return ray


def connect_ray(address: Optional[str] = "auto", **init_options: Any) -> Any:
    """Connect this process to Ray and return the ``ray`` module.

    ``address``: ``"auto"`` joins the cluster running on this machine (``ray start --head``, or
    ``$RAY_ADDRESS``) and starts a single-machine one when none runs; ``"local"`` (or None)
    always starts a fresh one here; anything else (``HOST:PORT``, ``ray://HOST:10001``) must be a
    running cluster. Nothing happens when Ray is already initialised (a caller's own ``ray.init``).
    Workers get this checkout on ``PYTHONPATH`` so they import the same ``evaluators``.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return ray
    paths = [_ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != _ROOT]
    options = {"runtime_env": {"env_vars": {"PYTHONPATH": os.pathsep.join(paths)}}, **init_options}
    # A cluster started here holds only small objects (cubins, results): 1 GiB of object store,
    # not Ray's default 30% of RAM, which a container's /dev/shm rarely has.
    local = {"object_store_memory": 1 << 30, **options}
    if address in (None, "", "local"):
        ray.init(**local)
    elif address == "auto":
        try:
            ray.init(address="auto", **options)
        except ConnectionError:
            ray.init(**local)
    else:
        try:
            ray.init(address=address, **options)
        except ConnectionError as exc:
            raise RayUnavailable(f"cannot reach the Ray cluster at {address!r}: {exc}") from None
    return ray


class GpuEvaluator:
    """The body of one GPU actor: a :class:`WorkerSupervisor` whose spawned child runs candidates.

    Ray gives the actor one GPU through ``CUDA_VISIBLE_DEVICES``; the supervisor's GPU 0 is that
    one. The child's pid is written next to its log, named by the pool and the slot, so that a
    replacement actor of the same pool on the same node can end a child its killed predecessor
    left behind (a hung kernel holding the GPU); another pool's children are never touched.
    """

    def __init__(self, pool_id: str, slot: int, target: str, options: Mapping[str, Any], log_dir: Optional[str],
                 deadlines: Optional[Mapping[str, float]]) -> None:
        self.slot = slot
        self.sup = WorkerSupervisor(0, target=target, options=options, log_dir=log_dir, deadlines=deadlines)
        self.pidfile = os.path.join(os.path.dirname(self.sup.log_path), f"ray-{pool_id}-slot{slot}.child")
        self._end_orphan()

    def start(self) -> dict[str, Any]:
        info = self.sup.start()
        self._note_child()
        import ray

        return {"info": info, "node": ray.util.get_node_ip_address(), "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
                "actor_pid": os.getpid(), "pid": self.sup.pid}

    def run(self, job: Mapping[str, Any]) -> dict[str, Any]:
        result = self.sup.run(job)
        self._note_child()  # a crash restarts the child: keep the pid file current
        return {"result": result, "pid": self.sup.pid, "restarts": self.sup.restarts, "info": self.sup.info}

    def close(self) -> None:
        self.sup.close()
        try:
            os.unlink(self.pidfile)
        except OSError:
            pass

    def _note_child(self) -> None:
        if self.sup.pid is not None:
            with open(self.pidfile, "w") as fh:
                fh.write(str(self.sup.pid))

    def _end_orphan(self) -> None:
        """Kill the process group of a worker child whose actor died without closing it."""
        import signal

        try:
            with open(self.pidfile) as fh:
                pid = int(fh.read().strip())
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"evaluators._worker" not in fh.read():
                    return  # the pid was reused by something else: leave it alone
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass


@dataclass
class RayPoolStats(PoolStats):
    """PoolStats plus what Ray adds: actors replaced, candidates retried, where compiles ran."""

    actors_replaced: int = 0
    retried: int = 0
    compile_workers: set = field(default_factory=set)   # (node, pid) of the Ray workers that compiled


def _compile_task(fn: Callable[..., Any], candidate: Candidate, arch: str, timeout_s: float,
                  cache_dir: Any) -> tuple[Any, str, int]:
    """A Ray task body: compile one candidate; return the result and where it ran."""
    import ray

    return fn(candidate, arch, timeout_s=timeout_s, cache_dir=cache_dir), ray.util.get_node_ip_address(), os.getpid()


class RayPool(EvaluatorPool):
    """Evaluate candidates on a Ray cluster's GPUs (see the module docstring).

    ``gpus``: how many GPU actors (an int, or a list whose length counts; None: every GPU the
    cluster has). ``address``: see :func:`connect_ray`. ``gpu_per_actor`` is the actor's
    ``num_gpus`` (tests on CPU-only clusters declare logical GPUs with ``ray.init(num_gpus=2)``).
    ``max_retries``: how many times a candidate whose actor died is tried again.
    """

    def __init__(self, gpus: Optional[Sequence[int] | int] = None, compile_workers: int = 4, *,
                 address: Optional[str] = "auto", arch: Optional[str] = None, target: str = HARNESS_TARGET,
                 worker_options: Optional[Mapping[str, Any]] = None, deadlines: Optional[Mapping[str, float]] = None,
                 log_dir: Optional[str] = None, timers: Sequence[str] = ("device", "offline", "server"),
                 qps: float = 2000.0, max_in_flight: Optional[int] = None, cache_dir: Any = None,
                 compile_timeout_s: float = 60.0, compile_fn: Optional[Callable[..., Any]] = None,
                 job_options: Optional[Mapping[str, Any]] = None, gpu_per_actor: float = 1.0,
                 max_retries: int = 1, start_timeout_s: Optional[float] = None,
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
        from ._provenance import code_version

        self.pool_id = uuid.uuid4().hex[:12]  # names this pool's worker pid files on every node
        self._actor_args = (target, {"evo_version": code_version(), **(worker_options or {})}, log_dir, deadlines)
        d = {**DEFAULT_DEADLINES, **(deadlines or {})}
        self.start_timeout_s = start_timeout_s or 3 * (d["startup"] + d["probe"]) + 60.0
        self._actor_cls = ray.remote(GpuEvaluator).options(num_gpus=gpu_per_actor, num_cpus=0, max_restarts=0)
        self._compile_remote = ray.remote(_compile_task).options(num_cpus=1, max_retries=2)
        self._lock = core.lock
        self._cv = threading.Condition(self._lock)
        self._queues: list[deque[PoolItem]] = [deque() for _ in self.gpus]
        self._affinity: dict[str, int] = {}
        self._serving = set(self.gpus)   # slots whose dispatcher still takes work with a working actor
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
    @property
    def stats(self) -> RayPoolStats:
        """PoolStats plus the Ray counts; assignable, as LocalPool's."""
        return self._core.stats  # type: ignore[return-value]

    @stats.setter
    def stats(self, value: RayPoolStats) -> None:
        self._core.stats = value

    @property
    def arch(self) -> str:
        """The target arch: given, else the first actor's worker's (waits for it)."""
        return self._core.arch

    def submit(self, candidate: Candidate, *, elite_threshold: Optional[float] = None) -> "Future[list[Evaluation]]":
        """Queue one candidate; blocks while the pool holds ``max_in_flight`` unfinished ones.
        ``elite_threshold``: as ``LocalPool.submit`` (below it the worker skips its memoisation pass)."""
        item = self._core.admit(candidate, elite_threshold)
        self._compile_pool.submit(self._core.compile, item, self._enqueue)
        return item.future

    def wait_ready(self, timeout: Optional[float] = None) -> bool:
        """Block until every actor has started (or given up); True when all are up."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                settled = all(s in self._views or s not in self._serving for s in self.gpus)
                if settled:
                    return len(self._views) == len(self.gpus) and self._serving == set(self.gpus)
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
        """Shape -> the slot its candidates are queued on."""
        with self._lock:
            return dict(self._affinity)

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

    # -- queues with shape affinity -----------------------------------------------------------
    def _enqueue(self, item: PoolItem, front: bool = False) -> None:
        """Queue a compiled item on its shape's actor (assigned on first sight: the serving slot
        with the fewest shapes); dropped instead once the pool is cancelled."""
        key = str(item.candidate.shapes[0])
        with self._cv:
            if not self._core.cancelled:
                slot = self._affinity.get(key)
                if slot is None or slot not in self._serving:
                    live = sorted(self._serving) or list(self.gpus)
                    load = {s: 0 for s in live}
                    for s in self._affinity.values():
                        if s in load:
                            load[s] += 1
                    slot = self._affinity[key] = min(live, key=lambda s: (load[s], s))
                (self._queues[slot].appendleft if front else self._queues[slot].append)(item)
                self._cv.notify_all()
                return
        self._core.drop(item)

    def _take(self, slot: int) -> Optional[PoolItem]:
        """The next item for ``slot``: its own queue first, else the oldest of the longest other
        queue; None (and the slot stops serving) once the pool is closed or cancelled and empty."""
        with self._cv:
            while True:
                item = self._pop_locked(slot)
                if item is not None:
                    return item
                if self._inputs_done or self._core.cancelled:
                    self._serving.discard(slot)
                    return None
                self._cv.wait(0.5)

    def _pop_locked(self, slot: Optional[int]) -> Optional[PoolItem]:
        if slot is not None and self._queues[slot]:
            return self._queues[slot].popleft()
        longest = max(self._queues, key=len)
        return longest.popleft() if longest else None

    # -- one dispatcher thread per GPU actor -------------------------------------------------
    def _dispatch(self, slot: int) -> None:
        down = self._start_actor(slot)
        try:
            while down is None:
                item = self._take(slot)
                if item is None:
                    return
                if self._core.cancelled:
                    self._core.drop(item)
                    continue
                down = self._run(slot, item)
            # this slot is gone for good: leave its work to the others, or fail it when none is left
            self._retire(slot, down)
        finally:
            self._stop_actor(slot)

    def _run(self, slot: int, item: PoolItem) -> Optional[str]:
        """Evaluate ``item`` on ``slot``'s actor; returns why the slot is down, or None."""
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
            with self._lock:
                self._running.pop(slot, None)
                self.stats.actors_replaced += 1
            why = f"GPU evaluator actor {slot} died ({type(exc).__name__})"
            if item.attempts <= self.max_retries:
                with self._lock:
                    self.stats.retried += 1
                self._enqueue(item, front=True)
            else:
                core.fail(item, Status.RUNTIME_ERROR, f"{why} while evaluating this candidate (attempt "
                                                      f"{item.attempts} of {self.max_retries + 1}); not retried again")
            return self._start_actor(slot)
        except WorkerUnavailable as exc:  # the actor's fresh worker failed its probes: try another actor
            with self._lock:
                self._running.pop(slot, None)
            core.fail(item, Status.RUNTIME_ERROR, f"GPU worker unavailable: {_short(exc)}")
            return self._start_actor(slot)
        except Exception as exc:  # an actor-side bug must not strand the future
            out = {"result": {"status": Status.RUNTIME_ERROR, "message": f"evaluator error: {_short(exc)}"}, "pid": None}
        core.job_ended(slot, t0, time.monotonic())
        with self._lock:
            self._running.pop(slot, None)
            view = self._views[slot]
            view.restarts = out.get("restarts", view.restarts)
            self.stats.restarts = self._restarts_before + sum(v.restarts for v in self._views.values())
        sup = SimpleNamespace(gpu=slot, pid=out.get("pid"),
                              info={**view.info, "provenance": {**view.info.get("provenance", {}),
                                                                **view.where, "ray_attempt": item.attempts}})
        core.finish(item, core.evaluations(item, out["result"], sup))
        return None

    def _start_actor(self, slot: int) -> Optional[str]:
        """Create and start ``slot``'s actor (worker start and probe included); returns why it
        failed, or None."""
        ray = self._ray
        self._stop_actor(slot)
        actor = self._actor_cls.remote(self.pool_id, slot, *self._actor_args)
        try:
            ready = ray.get(actor.start.remote(), timeout=self.start_timeout_s)
        except Exception as exc:  # WorkerUnavailable inside the actor, a timeout, a lost node
            ray.kill(actor, no_restart=True)
            return f"GPU evaluator actor {slot} could not start: {_short(exc)}"
        info = dict(ready["info"])
        view = SimpleNamespace(info=info, restarts=0, where={"ray_node": ready["node"], "ray_gpu_ids": ready["gpu_ids"],
                                                              "ray_actor_pid": ready["actor_pid"], "ray_slot": slot})
        with self._lock:
            old = self._views.get(slot)
            self._restarts_before += old.restarts if old is not None else 0
            self._actors[slot] = actor
            self._views[slot] = view
            self._core.set_arch(info.get("arch"))
        self._core.arch_settled()
        return None

    def _retire(self, slot: int, why: str) -> None:
        """``slot`` is gone: hand its queue (and shapes) to the serving slots, or, when none is
        left, fail every queued item (as LocalPool does once no GPU worker runs)."""
        with self._cv:
            self._serving.discard(slot)
            orphans = list(self._queues[slot])
            self._queues[slot].clear()
            for key in [k for k, s in self._affinity.items() if s == slot]:
                del self._affinity[key]
            if not self._serving:
                self._core.arch_settled()  # compiles waiting for an arch must not wait forever
            self._cv.notify_all()
        for item in orphans:
            self._enqueue(item)
        while True:
            with self._cv:
                if self._serving:
                    return
                item = self._pop_locked(None)
                if item is None:
                    if self._inputs_done or self._core.cancelled:
                        return
                    self._cv.wait(0.5)
                    continue
            self._core.fail(item, Status.RUNTIME_ERROR, f"GPU worker unavailable: {why}")

    def _stop_actor(self, slot: int) -> None:
        with self._lock:
            actor = self._actors.pop(slot, None)
        if actor is None:
            return
        try:
            self._ray.get(actor.close.remote(), timeout=30)
        except Exception:
            pass
        try:
            self._ray.kill(actor, no_restart=True)
        except Exception:
            pass


def _short(exc: BaseException, limit: int = 400) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= limit else text[:limit] + "..."

