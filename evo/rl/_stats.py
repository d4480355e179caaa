"""Improvement per adapter version: how the LLM-made candidates of each adapter fared at a shape
(what ``evo inspect`` shows, so an RL update's effect on the search is visible)."""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Optional

from populations import Archive, Evaluation, Shape

from ._reward import reward_of

__all__ = ["adapter_stats", "BASE"]

BASE = "base"  # the name shown for candidates made without an adapter


def adapter_stats(archive: Archive, shape: Shape) -> list[dict[str, Any]]:
    """Per adapter (``base`` for none), over the LLM-made candidates (those with a model) at
    ``shape``: proposals, evaluated, ok, improved (an ok fitness above its first parent's
    median fitness here), best fitness and mean reward; ordered by first appearance."""
    cands = archive.model_candidates(shape)  # from the frame keys: no candidate decoded
    if not cands:
        return []
    wanted = {c.id for c in cands} | {c.parent for c in cands if c.parent}
    evals: dict[str, list[Evaluation]] = defaultdict(list, archive.evaluations_of(shape, wanted))

    def fitness(cid: str) -> Optional[float]:
        fits = [e.fitness for e in evals.get(cid, ()) if e.fitness is not None]
        return statistics.median(fits) if fits else None

    rows: dict[str, dict[str, Any]] = {}
    for c in sorted(cands, key=lambda c: c.created):
        row = rows.setdefault(c.adapter or BASE, {"adapter": c.adapter or BASE, "proposals": 0, "evaluated": 0,
                                                  "ok": 0, "improved": 0, "best": None, "rewards": []})
        row["proposals"] += 1
        if c.id not in evals:
            continue
        row["evaluated"] += 1
        row["rewards"].append(reward_of(evals[c.id]))
        fit = fitness(c.id)
        if fit is None:
            continue
        row["ok"] += 1
        parent = fitness(c.parent) if c.parent else None
        row["improved"] += parent is None or fit > parent
        row["best"] = fit if row["best"] is None else max(row["best"], fit)
    out = []
    for row in rows.values():
        rewards = row.pop("rewards")
        row["mean_reward"] = statistics.fmean(rewards) if rewards else None
        row["improved_share"] = row["improved"] / row["evaluated"] if row["evaluated"] else None
        out.append(row)
    return out
