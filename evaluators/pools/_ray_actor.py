"""The Ray side of RayPool: connecting to a cluster, the GPU evaluator actor, the compile task.

What runs inside Ray workers lives here, apart from the pool's queues and threads
(``_ray_pool.py``): :class:`GpuEvaluator` (one actor per GPU, a WorkerSupervisor inside) and
:func:`_compile_task`. ``ray`` is imported only when a cluster is joined.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional

from populations import Candidate

from ..run import WorkerSupervisor

__all__ = ["RayUnavailable", "GpuEvaluator", "connect_ray", "import_ray", "compile_task"]

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # where `evaluators` lives


class RayUnavailable(ImportError):
    """Ray is not installed, or the cluster named cannot be reached."""


def import_ray() -> Any:
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
    ray = import_ray()
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

    def ping(self) -> bool:
        """Answers once Ray has placed the actor (its GPU is held): placement, not start-up."""
        return True

    def start(self) -> dict[str, Any]:
        info = self.sup.start()
        self._note_child()
        import ray

        return {"info": info, "node": ray.util.get_node_ip_address(), "node_id": ray.get_runtime_context().get_node_id(),
                "gpu_ids": [str(g) for g in ray.get_gpu_ids()],
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
                if b"evaluators.run._worker" not in fh.read():
                    return  # the pid was reused by something else: leave it alone
            os.killpg(pid, signal.SIGKILL)
        except (OSError, ValueError):
            pass


def compile_task(fn: Callable[..., Any], candidate: Candidate, arch: str, timeout_s: float,
                  cache_dir: Any) -> tuple[Any, str, int]:
    """A Ray task body: compile one candidate; return the result and where it ran."""
    import ray

    return fn(candidate, arch, timeout_s=timeout_s, cache_dir=cache_dir), ray.util.get_node_ip_address(), os.getpid()


