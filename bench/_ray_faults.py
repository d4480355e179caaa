"""Fault injection for bench/ray_scaling.py's fault legs (issue 23).

:class:`Killer` runs beside the engine: every ``period_s`` it reads what the archive holds
committed (a reader: no lock, the driver keeps writing), then kills one GPU actor
(``ray.kill``, slots in turn) or, on a two-node cluster, the worker node (every process of its
raylet) and starts that node again ``down_s`` later. :func:`fault_report` then checks, per
fault: nothing committed before it is missing at the end, and the throughput came back (the
evaluation rate over ``window_s`` starting ``window_s`` after the capacity returned, against the
rate over the ``window_s`` before the fault), and when the replacement actor was serving.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Optional, Sequence

from populations import Archive, Shape

__all__ = ["Killer", "committed", "fault_report"]

RECOVERED = 0.9   # the rate after a fault must reach this share of the rate before it
BACK_WITHIN_S = 30.0


def committed(path: Path, shapes: Sequence[Shape]) -> set[tuple[str, str]]:
    """(candidate id, shape) of every evaluation committed in the archive at ``path`` now."""
    with Archive(path, "r") as ar:
        have = set(ar.shapes())
        return {(e.candidate_id, str(s)) for s in shapes if s in have for e in ar.evaluations(s)}


class Killer(threading.Thread):
    """Kills an actor (``kind="actor"``) or node 1 of ``nodes`` (``kind="node"``) every
    ``period_s`` once ``start`` is called, until :meth:`stop`; ``faults`` lists what it did."""

    def __init__(self, pool: Any, archive_dir: Path, shapes: Sequence[Shape], period_s: float, *,
                 kind: str = "actor", nodes: Any = None, down_s: float = 10.0) -> None:
        super().__init__(name="evo-bench-killer", daemon=True)
        if kind == "node" and nodes is None:
            raise ValueError("node faults need the two-node cluster")
        self.pool, self.archive_dir, self.shapes = pool, archive_dir, list(shapes)
        self.period_s, self.kind, self.nodes, self.down_s = period_s, kind, nodes, down_s
        self.faults: list[dict[str, Any]] = []
        self.snapshots: list[set[tuple[str, str]]] = []
        self.errors: list[str] = []
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=self.down_s + 120)

    def run(self) -> None:
        turn = 0
        while not self._halt.wait(self.period_s):
            try:
                self.snapshots.append(committed(self.archive_dir, self.shapes))
                fault = self._node_fault() if self.kind == "node" else self._actor_fault(turn)
                fault["committed_before"] = len(self.snapshots[-1])
                self.faults.append(fault)
                print(f"[fault] {fault}", flush=True)
            except Exception as exc:  # reported, and the run goes on
                self.errors.append(f"{type(exc).__name__}: {exc}")
            turn += 1

    def _actor_fault(self, turn: int) -> dict[str, Any]:
        import ray

        slots = sorted(self.pool.serving()) or list(self.pool.gpus)
        slot = slots[turn % len(slots)]
        actor = self.pool.actor(slot)
        t = time.time()
        if actor is not None:
            ray.kill(actor, no_restart=True)
        return {"kind": "actor", "slot": slot, "t": t, "back_t": t, "killed": actor is not None}

    def _node_fault(self) -> dict[str, Any]:
        on_node = [s for s, w in self.pool.placement().items() if w.get("ray_gpu_ids")
                   and set(w["ray_gpu_ids"]) <= set(self.nodes.gpu_sets[1])]
        t = time.time()
        self.nodes.kill_node(1)
        self._halt.wait(self.down_s)
        back = time.time()
        self.nodes.start_node(1)
        return {"kind": "node", "slots": on_node, "t": t, "back_t": back}  # slots: refined by fault_report


def fault_report(faults: list[dict[str, Any]], snapshots: list[set], final: set, submitted: set,
                 eval_times: list[float], actor_events: list[tuple], end_t: float,
                 window_s: float = BACK_WITHIN_S) -> dict[str, Any]:
    """Per fault: the replacement's delay (``replaced_s``, from the capacity's return), the rates
    before and after, and whether it recovered (None when the run ended before the window after
    it did); overall: committed records lost (must be 0), candidates handed to the pool without
    an evaluation at the end."""
    times = sorted(eval_times)
    rows = []
    for i, f in enumerate(faults):
        slots = f.get("slots") or [f.get("slot")]
        if f["kind"] == "node":  # the slots the pool saw lost between this fault and the next
            until = faults[i + 1]["t"] if i + 1 < len(faults) else end_t
            slots = sorted({e[1] for e in actor_events if e[2] == "lost" and f["t"] <= e[0] < until}) or slots
        ups = [e[0] for e in actor_events if e[2] == "up" and e[1] in slots and e[0] >= f["back_t"]]
        before = _rate(times, f["t"] - window_s, f["t"])
        after = _rate(times, f["back_t"] + window_s, f["back_t"] + 2 * window_s)
        replaced: Optional[float] = (max(ups[:len(slots)]) - f["back_t"]) if slots and len(ups) >= len(slots) else None
        ratio = after / before if before > 0 else None
        judged = f["back_t"] + 2 * window_s <= end_t
        rows.append({**f, "replaced_s": _round(replaced), "rate_before": round(before, 3),
                     "rate_after": round(after, 3), "ratio": _round(ratio),
                     "recovered": None if not judged else bool(replaced is not None and replaced <= window_s
                                                              and ratio is not None and ratio >= RECOVERED)})
    lost = sorted({r for snap in snapshots for r in snap - final})
    return {"faults": rows, "committed_lost": len(lost), "lost_examples": lost[:5],
            "unevaluated": len(submitted - final),
            "all_recovered": all(r["recovered"] for r in judged) if (judged := [r for r in rows
                                                                               if r["recovered"] is not None]) else None,
            "window_s": window_s, "recovered_share": RECOVERED}


def _rate(times: list[float], t0: float, t1: float) -> float:
    import bisect

    return (bisect.bisect_left(times, t1) - bisect.bisect_left(times, t0)) / (t1 - t0) if t1 > t0 else 0.0


def _round(x: Optional[float]) -> Optional[float]:
    return None if x is None else round(x, 2)
