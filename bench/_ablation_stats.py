"""Paired bootstrap intervals for the operator ablation (issue 35): arm against knob alone.

Runs of two arms with the same seed share their shapes and their start (seeds, seed candidates),
so they are compared as pairs: for a field (improvement per GPU-second, best speedup at the end),
the ratio of the arm's mean to knob's mean over the seeds both finished, and a percentile
bootstrap 95% interval of that ratio from resampling the pairs (``reps`` resamples, seeded, so
a report is reproducible). A resample whose knob mean is not positive is dropped; fewer than two
pairs give no interval.
"""
from __future__ import annotations

import random
import statistics
from typing import Any, Callable, Optional, Sequence

__all__ = ["paired_ratio", "vs_base", "end_best", "ci95"]


def end_best(run: dict[str, Any]) -> Optional[float]:
    """The run's best speedup at its end (geomean over shapes): the last point of its curve."""
    return next((v for v in reversed(run.get("best_over_time") or []) if v is not None), None)


def ci95(values: Sequence[float]) -> list[Optional[float]]:
    """The percentile bootstrap's 95% interval of resampled ``values``: their 2.5th and 97.5th
    percentiles, rounded to 4 places (None, None where there are none)."""
    if not values:
        return [None, None]
    ordered = sorted(values)
    return [round(ordered[int(q * (len(ordered) - 1))], 4) for q in (0.025, 0.975)]


def paired_ratio(pairs: Sequence[tuple[float, float]], reps: int = 4000, seed: int = 0) -> dict[str, Any]:
    """Mean(arm) / mean(base) over ``pairs`` of (arm, base) values, with a bootstrap 95% interval."""
    out: dict[str, Any] = {"pairs": len(pairs), "ratio": None, "lo": None, "hi": None}
    base = statistics.fmean(b for _, b in pairs) if pairs else 0.0
    if not pairs or base <= 0:
        return out
    out["ratio"] = round(statistics.fmean(a for a, _ in pairs) / base, 4)
    if len(pairs) < 2:
        return out
    rng = random.Random(seed)
    ratios = []
    for _ in range(reps):
        sample = [pairs[rng.randrange(len(pairs))] for _ in pairs]
        b = statistics.fmean(x for _, x in sample)
        if b > 0:
            ratios.append(statistics.fmean(x for x, _ in sample) / b)
    out["lo"], out["hi"] = ci95(ratios)
    return out


FIELDS: dict[str, Callable[[dict[str, Any]], Optional[float]]] = {
    "improvement_per_gpu_s": lambda r: r.get("improvement_per_gpu_s"),
    "best_speedup_end": end_best,
}


def vs_base(runs: Sequence[dict[str, Any]], base: str = "knob", reps: int = 4000) -> dict[str, dict[str, Any]]:
    """Per arm other than ``base``, per field of :data:`FIELDS`: :func:`paired_ratio` over the
    seeds both arms finished (runs with ``evaluations``)."""
    done = [r for r in runs if "evaluations" in r]
    by = {(r["arm"], r["seed"]): r for r in done}
    out: dict[str, dict[str, Any]] = {}
    for arm in sorted({r["arm"] for r in done} - {base}):
        row = {}
        for field, value in FIELDS.items():
            pairs = []
            for (a, seed), r in sorted(by.items(), key=lambda kv: kv[0][1]):
                other = by.get((base, seed))
                if a != arm or other is None:
                    continue
                x, y = value(r), value(other)
                if x is not None and y is not None:
                    pairs.append((float(x), float(y)))
            row[field] = paired_ratio(pairs, reps)
        out[arm] = row
    return out
