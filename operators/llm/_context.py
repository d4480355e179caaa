"""The context that lets a model learn (issue 25): the shape's class, its roofline and the parent's
distance from it, and the strongest kernels measured at the shape with what they changed against
the parent (knob by knob), their times, roofline fractions and ptxas figures.

The words live in ``operators/prompts/context.toml`` (classes with their rules and hints, and the
sentences); this module only fills them in. :func:`describe_siblings` replaces a bare list of
inspirations: a small model sees, for the parent's own template, which knob changes went with
which speedups, the contrast evolutionary coders feed their models.
"""
from __future__ import annotations

import functools
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from populations import Evaluation, Shape, Status, evaluate, roofline_time
from populations import H200_DEFAULTS, Calibration

from .._base import ParentView

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["CONTEXT_FILE", "ShapeClass", "load_context", "shape_class", "describe_roofline", "describe_siblings",
           "knob_diff"]

CONTEXT_FILE = Path(__file__).resolve().parents[1] / "prompts" / "context.toml"


@dataclass(frozen=True)
class ShapeClass:
    name: str
    when: str
    hint: str


@dataclass(frozen=True)
class ContextData:
    classes: tuple[ShapeClass, ...]
    text: Mapping[str, str]


@functools.lru_cache(maxsize=4)
def load_context(path: Path = CONTEXT_FILE) -> ContextData:
    """The classes and sentences (every class rule is checked against a sample shape)."""
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    classes = tuple(ShapeClass(c["name"], str(c["when"]), c["hint"]) for c in data["classes"])
    if not classes:
        raise ValueError(f"{path}: no [[classes]]")
    for c in classes:
        evaluate(c.when, {"m": 1, "n": 1, "k": 1})  # a bad rule fails at load, not mid-run
    return ContextData(classes, dict(data["text"]))


def shape_class(shape: Shape, data: Optional[ContextData] = None) -> ShapeClass:
    """The first class whose rule holds for ``shape`` (the last class should always hold)."""
    data = data or load_context()
    env = {"m": shape.m, "n": shape.n, "k": shape.k}
    for c in data.classes:
        if evaluate(c.when, env):
            return c
    return data.classes[-1]


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f}"


def describe_roofline(shape: Shape, cal: Calibration = H200_DEFAULTS, data: Optional[ContextData] = None) -> str:
    """The shape's roofline floor and whether compute or memory bounds it."""
    data = data or load_context()
    flops_s, bytes_s = shape.flops / cal.peak_flops, shape.min_bytes / cal.read_bw
    return string.Template(data.text["roofline"]).substitute(
        floor_us=_us(roofline_time(shape, cal)), bound="compute" if flops_s >= bytes_s else "memory",
        flops_us=_us(flops_s), bytes_us=_us(bytes_s))


def _value(v: Any) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


def knob_diff(parent: Mapping[str, Any], other: Mapping[str, Any]) -> str:
    """``BM 128 -> 64, STAGES 2 -> 3``: the knobs ``other`` sets differently from ``parent``."""
    keys = [k for k in other if parent.get(k) != other.get(k)] + [k for k in parent if k not in other]
    return ", ".join(f"{k} {_value(parent.get(k, '-'))} -> {_value(other.get(k, '-'))}" for k in keys) or "same knobs"


def _facts(ev: Optional[Evaluation]) -> str:
    if ev is None:
        return "not measured"
    parts = [f"speedup {ev.fitness:.3f}x" if ev.fitness is not None else f"status {ev.status.value}"]
    t = ev.timers.get("device")
    if t is not None:
        parts.append(f"device {t.median * 1e6:.1f} us")
    if ev.roofline_frac is not None:
        parts.append(f"roofline {ev.roofline_frac:.2f}")
    if ev.kernels:
        ks = ev.kernels[0]
        parts.append(f"{ks.registers} regs, {ks.spill_stores + ks.spill_loads} spill B, {ks.smem_static} B smem")
    return "; ".join(parts)


def describe_siblings(parent: ParentView, items: Sequence[ParentView], data: Optional[ContextData] = None) -> str:
    """One line per strong kernel: its measurements and, for the parent's template, the knob
    changes from the parent (other templates: their knobs)."""
    if not items:
        return (data or load_context()).text["no_siblings"]
    lines = []
    for p in items:
        if parent.template and p.template == parent.template and parent.candidate.knobs is not None:
            how = "differs: " + knob_diff(dict(parent.knobs), dict(p.knobs))
        else:
            knobs = ", ".join(f"{k}={_value(v)}" for k, v in p.knobs.items()) or "no knobs"
            how = f"template {p.template or 'source'}: {knobs}"
        lines.append(f"- {p.id}: {_facts(p.evaluation)}; {how}")
    return "\n".join(lines)


def rank_siblings(parent: ParentView, history: Sequence[tuple[Any, Evaluation]], n: int) -> list[ParentView]:
    """The ``n`` fittest valid kernels of ``history`` other than the parent, those of the parent's
    template first (their knob changes teach the most), then any template."""
    ok = [ParentView(c, e) for c, e in history
          if e.fitness and e.status is Status.OK and not e.flags and c.id != parent.id]
    best: dict[str, ParentView] = {}
    for p in ok:  # the latest evaluation of a candidate wins
        best[p.id] = p
    ranked = sorted(best.values(), key=lambda p: -p.score)
    same = [p for p in ranked if parent.template and p.template == parent.template]
    rest = [p for p in ranked if p not in same]
    return (same + rest)[:max(n, 0)]
