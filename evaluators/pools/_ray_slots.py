"""RayPool's actor slots: starting a slot's GPU actor (waiting for Ray to place it, then probing
its worker), noticing it lost, retiring a slot for good and stopping its actor. A part of
:class:`._ray_pool.RayPool` (see its module docstring for the behaviour); the state it works on
(``_actors``, ``_views``, the ``_serving``/``_coming``/``_first`` slot sets, the queues and the
condition) is the pool's."""
from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Optional

from populations import Status


class ActorSlots:
    """The actor lifecycle methods of :class:`RayPool` (one dispatcher thread per slot calls them)."""

    def _alive(self, slot: int) -> bool:
        """An idle actor answers a ping at once; False when Ray says it is dead (a lost node
        would otherwise keep its shard until the next job sent there failed)."""
        with self._lock:
            actor = self._actors.get(slot)
        if actor is None:
            return False
        try:
            self._ray.get(actor.ping.remote(), timeout=30)
        except self._ray.exceptions.RayActorError:
            return False
        except Exception:  # slow, not known dead: leave it to the next job
            pass
        return True

    def _start_actor(self, slot: int, lost: bool) -> Optional[str]:
        """Create ``slot``'s actor, wait until Ray places it, start and probe its worker; returns
        why that failed, or None (the slot then serves). Placement waits ``start_timeout_s`` for
        the first actor; a replacement (``lost``) waits ``reclaim_s`` (None: while the pool is
        open), since the GPU it needs may come back only with its node. An actor that dies while
        starting (its node lost again) is replaced within the same wait; one whose worker cannot
        start (``WorkerUnavailable``, a start-up timeout) ends the slot."""
        ray = self._ray
        self._stop_actor(slot)
        with self._cv:
            self._coming.add(slot)
        limit = self.reclaim_s if lost else self.start_timeout_s
        t0 = time.monotonic()
        while True:
            actor = self._actor_cls.remote(self.pool_id, slot, *self._actor_args)
            placed = actor.ping.remote()
            while not ray.wait([placed], timeout=0.5)[0]:
                waited = time.monotonic() - t0
                with self._lock:
                    closing = self._core.cancelled or (self._inputs_done and not any(self._queues))
                if closing or (limit is not None and waited > limit):
                    ray.kill(actor, no_restart=True)
                    return (f"GPU evaluator actor {slot} was not placed: "
                            f"{'the pool closed' if closing else f'no GPU free for {waited:.0f} s'}")
            try:
                ray.get(placed)
                ready = ray.get(actor.start.remote(), timeout=self.start_timeout_s)
                break
            except ray.exceptions.RayActorError as exc:  # died while starting: its node went again
                with self._lock:
                    self.stats.actor_events.append((time.time(), slot, "lost", f"while starting ({type(exc).__name__})"))
                if limit is not None and time.monotonic() - t0 > limit:
                    return f"GPU evaluator actor {slot} could not start: {_short(exc)}"
            except Exception as exc:  # WorkerUnavailable inside the actor, a start-up timeout
                ray.kill(actor, no_restart=True)
                return f"GPU evaluator actor {slot} could not start: {_short(exc)}"
        info = dict(ready["info"])
        view = SimpleNamespace(info=info, restarts=0, where={"ray_node": ready["node"], "ray_node_id": ready["node_id"],
                                                              "ray_gpu_ids": ready["gpu_ids"],
                                                              "ray_actor_pid": ready["actor_pid"], "ray_slot": slot})
        with self._cv:
            old = self._views.get(slot)
            self._restarts_before += old.restarts if old is not None else 0
            self._actors[slot] = actor
            self._views[slot] = view
            self._core.set_arch(info.get("arch"))
            self._coming.discard(slot)
            self._first.discard(slot)
            self._serving.add(slot)
            self.stats.actor_events.append((time.time(), slot, "up", ready["node_id"]))
            self._reshard_locked()
            self._cv.notify_all()
        self._core.arch_settled()
        return None

    def _leave(self, slot: int, why: str) -> None:
        """``slot``'s actor is lost: it stops serving (a replacement is being started) and its
        shapes and queue go to the serving slots."""
        with self._cv:
            self._running.pop(slot, None)
            self.stats.actors_replaced += 1
            self.stats.actor_events.append((time.time(), slot, "lost", why))
            self._serving.discard(slot)
            self._coming.add(slot)
            self._reshard_locked()
            self._cv.notify_all()

    def _retire(self, slot: int, why: str) -> None:
        """``slot`` is gone for good: its shapes and queue go to the others, or, when no slot
        serves or is starting, every queued item fails (as LocalPool once no GPU worker runs)."""
        with self._cv:
            self._serving.discard(slot)
            self._coming.discard(slot)
            self._first.discard(slot)
            self.stats.actor_events.append((time.time(), slot, "gone", why))
            self._reshard_locked()
            if not self._serving and not self._coming:
                self._core.arch_settled()  # compiles waiting for an arch must not wait forever
            self._cv.notify_all()
        while True:
            with self._cv:
                if self._serving or self._coming:
                    return
                longest = max(self._queues, key=len)
                item = longest.popleft() if longest else None
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
