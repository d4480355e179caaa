"""A dependency-free SVG figure of a learning check (the device image has no matplotlib).

:func:`check_figure` draws three panels from a learning check's result: the share of proposals
per value of the target knob before and after training (bars), and the sampled reward mean and
the KL estimate per GRPO step (lines). :func:`svg_panels` is the small drawing routine behind it.
"""
from __future__ import annotations

import math
import os
from html import escape
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

__all__ = ["svg_panels", "check_figure"]

_W, _H, _PAD = 340, 240, 42
_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#e45756")


def _ticks(lo: float, hi: float) -> list[float]:
    step = 10 ** math.floor(math.log10(max(hi - lo, 1e-12))) if hi > lo else 1.0
    if (hi - lo) / step < 3:
        step /= 2
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step) + 1)]


def _panel(x0: float, title: str, kind: str, labels: Sequence[Any], series: Mapping[str, Sequence[Any]]) -> list[str]:
    values = [float(v) for vs in series.values() for v in vs if v is not None and math.isfinite(float(v))]
    lo, hi = min(values + [0.0]), max(values + [0.0])
    if hi - lo < 1e-9:
        hi = lo + 1.0
    pw, ph = _W - _PAD - 10, _H - 2 * _PAD

    def y(v: float) -> float:
        return _PAD + ph * (1 - (v - lo) / (hi - lo))

    out = [f'<text x="{x0 + _W / 2}" y="18" text-anchor="middle" font-size="13">{escape(title)}</text>',
           f'<line x1="{x0 + _PAD}" y1="{_PAD}" x2="{x0 + _PAD}" y2="{_PAD + ph}" stroke="#333"/>',
           f'<line x1="{x0 + _PAD}" y1="{y(0):.1f}" x2="{x0 + _PAD + pw}" y2="{y(0):.1f}" stroke="#333"/>']
    for t in _ticks(lo, hi):
        out.append(f'<text x="{x0 + _PAD - 4}" y="{y(t) + 4:.1f}" text-anchor="end" font-size="10">{t:g}</text>')
    n = max(len(labels), 1)
    if kind == "bars":
        width = pw / n / (len(series) + 1)
        for j, (name, vs) in enumerate(series.items()):
            for i, v in enumerate(vs):
                x = x0 + _PAD + i * pw / n + (j + 0.5) * width
                top = y(max(float(v), 0.0))
                out.append(f'<rect x="{x:.1f}" y="{top:.1f}" width="{width:.1f}" height="{abs(y(0) - top):.1f}" '
                           f'fill="{_COLOURS[j % 4]}"><title>{escape(str(labels[i]))} {escape(name)}: {v}</title></rect>')
        for i, label in enumerate(labels):
            out.append(f'<text x="{x0 + _PAD + (i + 0.5) * pw / n:.1f}" y="{_PAD + ph + 14}" text-anchor="middle" '
                       f'font-size="10">{escape(str(label))}</text>')
    else:
        for j, (name, vs) in enumerate(series.items()):
            pts = [(x0 + _PAD + (i + 0.5) * pw / n, y(float(v))) for i, v in enumerate(vs) if v is not None]
            if pts:
                out.append(f'<polyline fill="none" stroke="{_COLOURS[j % 4]}" stroke-width="1.5" points="'
                           + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        out.append(f'<text x="{x0 + _PAD + pw / 2}" y="{_PAD + ph + 14}" text-anchor="middle" font-size="10">'
                   f'step (1..{len(labels)})</text>')
    for j, name in enumerate(series):
        out.append(f'<text x="{x0 + _PAD + 6}" y="{_PAD + 12 + 12 * j}" font-size="10" fill="{_COLOURS[j % 4]}">'
                   f'{escape(name)}</text>')
    return out


def svg_panels(path: Union[str, os.PathLike], title: str,
               panels: Sequence[tuple[str, str, Sequence[Any], Mapping[str, Sequence[Any]]]]) -> Path:
    """Write panels side by side as one SVG: each is (title, "bars" | "lines", x labels, {series: values})."""
    body = []
    for i, (ptitle, kind, labels, series) in enumerate(panels):
        if kind not in ("bars", "lines"):
            raise ValueError(f"panel kind must be bars or lines, got {kind!r}")
        body += _panel(i * _W, ptitle, kind, labels, series)
    width = _W * max(len(panels), 1)
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{_H + 20}" font-family="sans-serif">'
           f'<rect width="100%" height="100%" fill="white"/>'
           f'<text x="{width / 2}" y="{_H + 14}" text-anchor="middle" font-size="11">{escape(title)}</text>'
           + "".join(body) + "</svg>\n")
    path = Path(path)
    path.write_text(svg)
    return path


def check_figure(path: Union[str, os.PathLike], result: Mapping[str, Any]) -> Path:
    """The learning check's figure from its result.json contents (see the module docstring)."""
    knob = result["knob"]
    before, after = result.get("values_before", {}), result.get("values_after", {})
    labels = sorted(set(before) | set(after), key=lambda v: (str(v) != str(result["value"]), str(v)))
    steps = result.get("steps", [])
    return svg_panels(path, f"{result.get('evaluator')} check at {result['shape']}: {knob}={result['value']} "
                            f"{result['before']:.0%} -> {result['after']:.0%} of {result['samples']} proposals", [
        (f"proposals by {knob} value", "bars", labels,
         {"before": [before.get(v, 0) / result["samples"] for v in labels],
          "after": [after.get(v, 0) / result["samples"] for v in labels]}),
        ("sampled reward mean per step", "lines", list(range(1, len(steps) + 1)),
         {"reward": [s.get("reward_mean") for s in steps]}),
        ("KL (on-policy samples) per step", "lines", list(range(1, len(steps) + 1)),
         {"kl": [s.get("kl") for s in steps]}),
    ])
