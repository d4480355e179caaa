"""Sharding shapes across GPU actors by expected GPU time (issue 23).

The engine splits evaluations between shapes in proportion to their allocation weights (their
roofline headroom, ``evo/search/_budget.py``), so the GPU time a shape will ask for is its weight times
the seconds one of its jobs takes. :func:`shard` gives every shape one actor slot so that those
expected loads come out even across the slots (longest-processing-time first), while keeping a
shape on the slot it already has whenever that slot stays within ``slack`` of the even share:
a shape that stays put keeps its timing buffers and cuBLAS arms cached in that actor's worker.
What the split cannot even out (one shape heavier than a whole share, a burst of one shape's
candidates) work stealing in the pool covers: an idle actor takes queued work from the others.

Pure functions, no Ray: the pool calls them under its lock.
"""
from __future__ import annotations

from typing import Hashable, Mapping, Optional, Sequence, TypeVar

__all__ = ["shape_loads", "shard", "slot_loads"]

K = TypeVar("K", bound=Hashable)


def shape_loads(weights: Mapping[K, float], job_seconds: Mapping[K, float],
                default_s: Optional[float] = None) -> dict[K, float]:
    """Expected GPU time per shape: weight x mean job seconds. A shape not timed yet costs
    ``default_s`` (None: the mean over the shapes timed, else 1 s); a negative weight counts 0."""
    if default_s is None:
        known = [s for s in job_seconds.values() if s > 0]
        default_s = sum(known) / len(known) if known else 1.0
    return {k: max(0.0, float(w)) * (job_seconds.get(k) or default_s) for k, w in weights.items()}


def shard(loads: Mapping[K, float], slots: Sequence[int], current: Mapping[K, int],
          slack: float = 0.25) -> dict[K, int]:
    """A slot for every key of ``loads`` (empty when there is no slot).

    Keys are placed heaviest first (ties by their text, so the result does not depend on
    dictionary order); a key keeps its ``current`` slot while that slot's total stays within
    ``(1 + slack)`` of the even share (or of the heaviest single key, when one is heavier than a
    share), else it goes to the slot with the least load so far (then the fewest keys, then the
    lowest number). Zero-load keys (shapes that yielded) stay where they are, or fill the
    emptiest slots."""
    if not slots:
        return {}
    total = sum(max(0.0, v) for v in loads.values())
    biggest = max((max(0.0, v) for v in loads.values()), default=0.0)
    cap = max(total / len(slots) * (1.0 + slack), biggest) * (1.0 + 1e-9)
    filled = {s: 0.0 for s in slots}
    count = {s: 0 for s in slots}
    out: dict[K, int] = {}
    for key in sorted(loads, key=lambda k: (-max(0.0, loads[k]), str(k))):
        load = max(0.0, loads[key])
        slot = current.get(key)
        if slot not in filled or filled[slot] + load > cap:
            slot = min(slots, key=lambda s: (filled[s], count[s], s))
        out[key] = slot
        filled[slot] += load
        count[slot] += 1
    return out


def slot_loads(assignment: Mapping[K, int], loads: Mapping[K, float], slots: Sequence[int]) -> dict[int, float]:
    """The total expected load per slot of ``assignment`` (slots without a key count 0)."""
    out = {s: 0.0 for s in slots}
    for key, slot in assignment.items():
        if slot in out:
            out[slot] += max(0.0, loads.get(key, 0.0))
    return out
