"""Plot eval_bench results: throughput and NVML busy per shape, and repeatability per start.

    python bench/eval_bench_plot.py --run "session 3=results/eval_bench_h200_2026-12-01.json" \
        --run "gated=..." --out results/eval_bench_s4.png

Left: candidates per minute per shape and run, each bar labelled with NVML's busy share over the
evaluation phase (the dashed lines are the targets: 100/min, and 80% written on the bars).
Right: every repeatability start's device median over the median of its starts, per run and
config, with the spread ((max - min) / median) in the legend; the grey bar from each lowest start
spans the 2% target.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any


def load(spec: str) -> tuple[str, dict[str, Any]]:
    label, _, path = spec.partition("=")
    if not path:
        raise SystemExit(f"--run wants LABEL=FILE, got {spec!r}")
    with open(path) as f:
        return label, json.load(f)


def throughput_rows(runs: list[tuple[str, dict]]) -> list[tuple[str, str, float, float | None]]:
    """(shape, run label, per minute, NVML % over the evaluation phase) for every measured shape."""
    rows = []
    for label, rep in runs:
        for key, val in rep.items():
            if isinstance(val, dict) and "per_minute" in val:
                rows.append((key.split(":")[0], label, float(val["per_minute"]), val.get("nvml_util_eval")))
    return rows


def repeat_series(runs: list[tuple[str, dict]]) -> list[tuple[str, list[float], float]]:
    """(label, per-start medians over their median, spread) for every repeatability config."""
    out = []
    for label, rep in runs:
        r = rep.get("repeatability") or {}
        configs = r.get("configs") or ({"": r} if r.get("medians_us") else {})
        for name, c in configs.items():
            meds = c["medians_us"]
            mid = statistics.median(meds)
            out.append((f"{label} {name}".strip(), [m / mid for m in meds], c["spread"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", action="append", required=True, help="LABEL=eval_bench.json (repeatable)")
    ap.add_argument("--out", required=True, help="PNG to write")
    args = ap.parse_args(argv)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("eval_bench_plot: matplotlib is not installed", file=sys.stderr)
        return 2
    runs = [load(s) for s in args.run]
    rows, series = throughput_rows(runs), repeat_series(runs)
    if not rows and not series:
        print("eval_bench_plot: no throughput or repeatability in these files", file=sys.stderr)
        return 1
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    shapes = list(dict.fromkeys(r[0] for r in rows))
    labels = list(dict.fromkeys(r[1] for r in rows))
    width = 0.8 / max(1, len(labels))
    for j, label in enumerate(labels):
        named = False
        for i, shape in enumerate(shapes):
            got = [r for r in rows if r[0] == shape and r[1] == label]
            if not got:
                continue
            _, _, per_min, nvml = got[0]
            x = i + (j - (len(labels) - 1) / 2) * width
            ax1.bar(x, per_min, width, color=f"C{j}", label=None if named else label)
            named = True
            ax1.text(x, per_min + 2, "-" if nvml is None else f"{nvml:.0f}%", ha="center", fontsize=8)
    ax1.axhline(100, ls="--", c="grey", lw=1)
    ax1.set_xticks(range(len(shapes)), shapes)
    ax1.set_ylabel("candidates per minute (label: NVML busy, eval phase)")
    ax1.set_title("Throughput, 200 template candidates per shape")
    ax1.set_ylim(0, 1.25 * max(r[2] for r in rows)) if rows else None
    ax1.legend(fontsize=7, loc="upper left")
    for k, (label, rel, spread) in enumerate(series):
        ax2.plot([k] * len(rel), rel, "o", c=f"C{k}", label=f"{label}: spread {100 * spread:.2f}%")
        ax2.vlines(k, min(rel), min(rel) + 0.02, colors="0.8", lw=6, zorder=0)  # what a 2% spread may span
    ax2.set_xticks(range(len(series)), [s[0] for s in series], rotation=20, ha="right", fontsize=8)
    ax2.set_ylabel("start's device median / median of starts")
    ax2.set_title("Repeatability over 5 worker starts (sm90 seed, 4096^3)")
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
