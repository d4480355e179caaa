"""The peers benchmark's numbers after the GPU: CSV rows, summary, markdown, plots, CUDA-L2 join.

Everything here runs on a CPU from ``peers.csv`` alone, so a run's summary can be rebuilt (and
joined with CUDA-L2's published numbers, which are not on the device) with
``peers_bench.py --summarize peers.csv``.

A row is one shape. Times are medians in microseconds, one column per timer and arm:
``{timer}_{arm}_us`` (:data:`TIMERS` x :data:`ARMS`). A speedup "X vs Y" is ``time(Y) / time(X)``
in one timer, so above 1 means X is faster. ``torch`` is the faster of ``torch_nn`` and
``torch_tn`` (torch.matmul on both layouts of the same product, as the evaluator's baseline);
``best_peer`` is the fastest of torch, the two cuBLASLt arms and Triton that were measured.
The evolved arms count only where the fresh-input correctness check passed
(``evolved_check == "pass"``).

``archived_device_speedup`` and ``seed_archived_device_speedup`` (``--seed-archive``) are the
archives' own figures (the evaluator's device timer vs torch.matmul, median of the elite's
measurements): evolved vs seed compares them shape by shape, so the gain of evolution is read
on one measurement method, beside what this run measured.
"""
from __future__ import annotations

import csv
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

__all__ = ["TIMERS", "ARMS", "PEERS", "COMPARISONS", "CSV_FIELDS", "PLOTS", "decade", "speedup", "with_speedups",
           "summarize", "markdown", "read_rows", "write_rows", "cuda_l2_join", "write_join", "plots", "write_summary"]

TIMERS = ("device", "offline", "server")
#: evolved: the exported launcher called with pre-bound pointers (or the evaluator's launch path
#: where export failed); evolved_op: ``torch.ops.evo.hgemm(a, b)``, the user's host path
#: (allocates C; host timers only); torch_nn/torch_tn: torch.matmul(out=) on each layout.
ARMS = ("evolved", "evolved_op", "torch_nn", "torch_tn", "lt_heuristic", "lt_autotuned", "triton")
PEERS = ("torch", "lt_heuristic", "lt_autotuned", "triton")
#: (subject, reference) pairs the summary reports, headline first.
COMPARISONS = (("evolved", "torch"), ("evolved", "lt_heuristic"), ("evolved", "lt_autotuned"),
               ("evolved", "triton"), ("evolved", "best_peer"), ("evolved_op", "torch"),
               ("lt_heuristic", "torch"), ("lt_autotuned", "torch"), ("triton", "torch"))
ID_FIELDS = ("shape", "M", "N", "K", "layout", "flops", "decade", "candidate", "template", "evolved_path",
             "archived_device_speedup", "seed_archived_device_speedup", "evolved_check", "evolved_rel_err", "evolved_err_over_tol")
NOTE_FIELDS = ("lt_path", "lt_note", "triton_config", "triton_note", "rotation_sets", "notes")
CSV_FIELDS = (ID_FIELDS + tuple(f"{t}_{a}_us" for t in TIMERS for a in ARMS)
              + tuple(f"{t}_{s}_vs_{r}" for t in TIMERS for s, r in COMPARISONS) + NOTE_FIELDS)
PLOTS = ("speedup_vs_flops.png", "speedup_per_decade.png", "heatmap_device.png")
#: CUDA-L2's published columns (``-max``: against the faster baseline layout) and our equivalents.
CUDA_L2_COLUMNS = (("torch.matmul", "torch"), ("cuBLASLt-heuristic-max", "lt_heuristic"),
                   ("cuBLASLt-auto-tuning-max", "lt_autotuned"))
CUDA_L2_FILE = "eval_results/cuda_l2_h100_F32F16F16F32_speedup_{mode}.csv"


def decade(flops: int) -> str:
    """``1e9`` for 1e9 <= flops < 1e10 (exact integer arithmetic, no log rounding)."""
    if flops < 1:
        raise ValueError(f"FLOPs must be positive, got {flops}")
    return f"1e{len(str(int(flops))) - 1}"


def _num(x: Any) -> Optional[float]:
    if x is None or x == "":
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) and v > 0 else None


def _time(row: dict[str, Any], timer: str, arm: str) -> Optional[float]:
    """An arm's time in one timer, None where not measured (or the evolved kernel failed its check)."""
    if arm.startswith("evolved") and row.get("evolved_check") != "pass":
        return None
    if arm == "torch":
        ts = [t for t in (_num(row.get(f"{timer}_torch_nn_us")), _num(row.get(f"{timer}_torch_tn_us"))) if t]
        return min(ts) if ts else None
    if arm == "best_peer":
        ts = [t for t in (_time(row, timer, p) for p in PEERS) if t]
        return min(ts) if ts else None
    return _num(row.get(f"{timer}_{arm}_us"))


def speedup(row: dict[str, Any], timer: str, subject: str, reference: str) -> Optional[float]:
    """``time(reference) / time(subject)`` in ``timer``, None when either is missing."""
    s, r = _time(row, timer, subject), _time(row, timer, reference)
    return r / s if s and r else None


def with_speedups(row: dict[str, Any]) -> dict[str, Any]:
    """The row with its ``{timer}_{subject}_vs_{reference}`` columns (re)computed from the times."""
    out = dict(row)
    for t in TIMERS:
        for s, r in COMPARISONS:
            x = speedup(row, t, s, r)
            out[f"{t}_{s}_vs_{r}"] = "" if x is None else round(x, 5)
    return out


def _geomean(xs: Sequence[float]) -> Optional[float]:
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def _stats(xs: Sequence[float]) -> dict[str, Any]:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean": statistics.fmean(xs), "geomean": _geomean(xs), "median": statistics.median(xs),
            "min": min(xs), "max": max(xs), "wins": sum(x > 1.0 for x in xs) / len(xs)}


def summarize(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per timer and comparison: n, mean, geomean, median, min, max, share of wins (> 1), and the
    same per FLOP decade; plus counts of shapes, evolved kernels and failed checks."""
    rows = list(rows)
    out: dict[str, Any] = {"shapes": len(rows),
                           "with_evolved": sum(1 for r in rows if r.get("candidate")),
                           "evolved_checked_ok": sum(1 for r in rows if r.get("evolved_check") == "pass"),
                           "evolved_failed": [r["shape"] for r in rows
                                              if r.get("evolved_check") not in (None, "", "pass")],
                           "paths": dict(sorted(_count(r.get("evolved_path") or "none" for r in rows).items())),
                           "timers": {}}
    decades = sorted({decade(int(r["flops"])) for r in rows}, key=lambda d: int(d[2:]))
    out["decades"] = decades
    for t in TIMERS:
        per: dict[str, Any] = {}
        for s, r in COMPARISONS:
            pairs = [(decade(int(row["flops"])), x) for row in rows if (x := speedup(row, t, s, r)) is not None]
            if not pairs:
                continue
            st = _stats([x for _, x in pairs])
            by: dict[str, list[float]] = defaultdict(list)
            for d, x in pairs:
                by[d].append(x)
            st["per_decade"] = {d: _stats(by[d]) for d in decades if by.get(d)}
            per[f"{s} vs {r}"] = st
        if per:
            out["timers"][t] = per
    out["seed_vs_evolved"] = _seed_gain(rows, decades)
    head = out["timers"].get("device", {}).get("evolved vs torch")
    if head:
        low = [d for d, st in head["per_decade"].items() if st["geomean"] < 1.0]
        out["compass"] = {"device_geomean_vs_cublas": head["geomean"], "target": 1.10,
                          "decades_below_1": low, "met": head["geomean"] >= 1.10 and not low}
    return out


def _seed_gain(rows: Sequence[dict[str, Any]], decades: Sequence[str]) -> Optional[dict[str, Any]]:
    """Archived evolved vs archived seed speedups (both the evaluator's device figure vs torch),
    overall and per decade: geomeans of each, of the per-shape gain, and the share improved;
    None when no row has both."""
    pairs = [(decade(int(r["flops"])), s, e) for r in rows
             if (s := _num(r.get("seed_archived_device_speedup"))) and (e := _num(r.get("archived_device_speedup")))]
    if not pairs:
        return None

    def stats(ps: Sequence[tuple[str, float, float]]) -> dict[str, Any]:
        return {"n": len(ps), "seed_geomean": _geomean([s for _, s, _ in ps]),
                "evolved_geomean": _geomean([e for _, _, e in ps]), "gain_geomean": _geomean([e / s for _, s, e in ps]),
                "improved": sum(e > s for _, s, e in ps) / len(ps)}
    return {**stats(pairs), "per_decade": {d: stats(ps) for d in decades if (ps := [p for p in pairs if p[0] == d])}}


def _count(xs: Iterable[str]) -> dict[str, int]:
    c: dict[str, int] = defaultdict(int)
    for x in xs:
        c[x.split(":")[0]] += 1
    return c


def _x(v: Optional[float]) -> str:
    return "–" if v is None else f"{v:.3f}x"


def markdown(summary: dict[str, Any], meta: Optional[dict[str, Any]] = None,
             join: Optional[dict[str, Any]] = None) -> str:
    """The summary as markdown: a table per timer (comparisons x statistics and per-decade
    geomeans), the compass line, and the CUDA-L2 published comparison when given."""
    meta = meta or {}
    lines = ["# evo vs peers", ""]
    for k, v in meta.items():
        lines.append(f"- {k}: {v}")
    lines += [f"- shapes measured: {summary['shapes']}; with an evolved kernel: {summary['with_evolved']}; "
              f"passed the fresh-input check: {summary['evolved_checked_ok']}",
              f"- evolved kernel path: {', '.join(f'{k} {v}' for k, v in summary['paths'].items())}"]
    if summary["evolved_failed"]:
        lines.append(f"- **failed the fresh-input check** (excluded): {', '.join(summary['evolved_failed'])}")
    comp = summary.get("compass")
    if comp:
        verdict = "met" if comp["met"] else "not met"
        low = ", ".join(comp["decades_below_1"]) or "none"
        lines.append(f"- compass (device geomean >= 1.10x vs cuBLAS, no decade below 1.00x): **{verdict}**: "
                     f"{comp['device_geomean_vs_cublas']:.3f}x, decades below 1.00x: {low}")
    lines.append("")
    decades = summary["decades"]
    lines += _decade_table(summary)
    for t, per in summary["timers"].items():
        lines += [f"## {t} timer", "", "Speedup = time(reference) / time(subject); wins = share of shapes above 1.", ""]
        head = ["subject vs reference", "n", "mean", "geomean", "median", "min", "wins"] + [f"{d} (n)" for d in decades]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "---|" * len(head))
        for name, st in per.items():
            cells = [name, str(st["n"]), _x(st["mean"]), _x(st["geomean"]), _x(st["median"]), _x(st["min"]),
                     f"{st['wins'] * 100:.0f}%"]
            for d in decades:
                pd = st["per_decade"].get(d)
                cells.append(f"{pd['geomean']:.3f}x ({pd['n']})" if pd else "–")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    if join is not None:
        lines += _join_markdown(join)
    return "\n".join(lines) + "\n"


def _decade_table(summary: dict[str, Any]) -> list[str]:
    """One row per FLOP decade (and all): the headline comparisons, and evolved vs seed when known."""
    timers = summary["timers"]
    cols = [("device", "evolved vs torch"), ("device", "evolved vs best_peer"), ("offline", "evolved vs torch"),
            ("server", "evolved vs torch")]
    cols = [(t, c) for t, c in cols if c in timers.get(t, {})]
    if not cols:
        return []
    seed = summary.get("seed_vs_evolved")
    head = (["decade", "shapes", "device vs torch: geomean", "min", "wins"]
            + [f"{t} vs {c.split(' vs ')[1].replace('_', ' ')}" for t, c in cols[1:]])
    if seed:
        head += ["seed (archived)", "evolved (archived)", "evolved / seed", "improved"]
    lines = ["## Per FLOP decade", "",
             "Geomean speedups of the evolved kernel as measured in this run (device timer unless named). "
             + ("The archived columns are the archives' own device figures vs torch.matmul, seed archive and "
                "evolved archive, shape by shape (`improved`: evolved above seed). " if seed else "")
             + "The compass asks every decade's device geomean vs torch to be >= 1.00x.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    first = timers[cols[0][0]][cols[0][1]]
    for d in [*summary["decades"], "all"]:
        st = first if d == "all" else first["per_decade"].get(d)
        cells = [f"**{d}**" if d == "all" else d, "0" if st is None else str(st["n"])]
        cells += ["–", "–", "–"] if st is None else [_x(st["geomean"]), _x(st["min"]), f"{st['wins'] * 100:.0f}%"]
        for t, c in cols[1:]:
            other = timers[t][c] if d == "all" else timers[t][c]["per_decade"].get(d)
            cells.append(_x(other["geomean"]) if other else "–")
        if seed:
            sd = seed if d == "all" else seed["per_decade"].get(d)
            cells += (["–"] * 4 if sd is None else
                      [_x(sd["seed_geomean"]), _x(sd["evolved_geomean"]), _x(sd["gain_geomean"]),
                       f"{sd['improved'] * 100:.0f}% of {sd['n']}"])
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


# -- CSV ------------------------------------------------------------------------------------
def write_rows(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(CSV_FIELDS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow(with_speedups(r))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a peers CSV; raises ValueError when it lacks the identifying columns."""
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [f for f in ("shape", "M", "N", "K", "flops") if f not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: not a peers CSV (no column {', '.join(missing)})")
        return [dict(r) for r in reader]


# -- CUDA-L2's published H100 numbers -----------------------------------------------------
def cuda_l2_join(rows: Sequence[dict[str, Any]], anchors: Path) -> dict[str, Any]:
    """Our measured speedups beside CUDA-L2's published H100 ones on the shapes both cover.

    Published = CUDA-L2's ``eval_results`` (H100, their kernels, their timers ``offline`` and
    ``server``), copied, not re-measured; ours = evolved vs the same baselines on this run's GPU.
    Only TN f32 shapes join (their kernels are TN with fp32 accumulation by label)."""
    published: dict[str, dict[tuple[int, int, int], dict[str, float]]] = {}
    for mode in ("offline", "server"):
        path = anchors / CUDA_L2_FILE.format(mode=mode)
        if not path.is_file():
            raise FileNotFoundError(f"CUDA-L2 results not found: {path}")
        with open(path, newline="") as fh:
            table = {}
            for r in csv.DictReader(fh):
                m, n, k = (int(x) for x in r["mnk"].split("_"))
                table[(m, n, k)] = {col: float(r[col]) for col, _ in CUDA_L2_COLUMNS}
            published[mode] = table
    out_rows = []
    for row in rows:
        key = (int(row["M"]), int(row["N"]), int(row["K"]))
        if row.get("layout", "TN") != "TN" or key not in published["offline"]:
            continue
        j: dict[str, Any] = {"shape": row["shape"], "M": key[0], "N": key[1], "K": key[2], "flops": row["flops"]}
        for mode in ("offline", "server"):
            for col, ours in CUDA_L2_COLUMNS:
                mine = speedup(row, mode, "evolved", ours)
                j[f"{mode}_evo_vs_{ours}_measured"] = "" if mine is None else round(mine, 4)
                j[f"{mode}_cuda_l2_vs_{ours}_h100_published"] = published[mode].get(key, {}).get(col, "")
        out_rows.append(j)
    stats = {}
    for mode in ("offline", "server"):
        for _, ours in CUDA_L2_COLUMNS:
            both = [(float(r[f"{mode}_evo_vs_{ours}_measured"]), float(r[f"{mode}_cuda_l2_vs_{ours}_h100_published"]))
                    for r in out_rows if r[f"{mode}_evo_vs_{ours}_measured"] != ""
                    and r[f"{mode}_cuda_l2_vs_{ours}_h100_published"] != ""]
            stats[f"{mode} vs {ours}"] = {"n": len(both), "evo_geomean": _geomean([a for a, _ in both]),
                                          "cuda_l2_geomean": _geomean([b for _, b in both])}
    return {"rows": out_rows, "stats": stats, "source": str(anchors)}


def write_join(path: Path, join: dict[str, Any]) -> None:
    rows = join["rows"]
    fields = ["shape", "M", "N", "K", "flops"] + [f"{m}_{w}_vs_{o}_{s}" for m in ("offline", "server")
                                                  for _, o in CUDA_L2_COLUMNS
                                                  for w, s in (("evo", "measured"), ("cuda_l2", "h100_published"))]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def _join_markdown(join: dict[str, Any]) -> list[str]:
    lines = ["## CUDA-L2 (published, not re-measured)", "",
             f"CUDA-L2's own H100 speedups from its repository (`{join['source']}`), on the {len(join['rows'])} "
             "shapes both cover, beside evo's measured speedups on this run's GPU over the same baselines. "
             "Different GPU, different kernels' timers: read as context, not as a head-to-head. Both over the "
             "same shapes (geomean).", "",
             "| timer, reference | shapes | evo (measured here) | CUDA-L2 H100 (published) |", "|---|---|---|---|"]
    for name, st in join["stats"].items():
        lines.append(f"| {name} | {st['n']} | {_x(st['evo_geomean'])} | {_x(st['cuda_l2_geomean'])} |")
    return lines + [""]


# -- plots ------------------------------------------------------------------------------------
def plots(rows: Sequence[dict[str, Any]], out: Path) -> list[str]:
    """Speedup vs FLOPs (evolved vs torch.matmul, per timer), per-decade box plots (device timer,
    evolved vs each peer) and an M x N heatmap per K (device, evolved vs torch.matmul). Returns
    the files written ([] without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.colors import TwoSlopeNorm
    except ImportError:
        return []
    written = []
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for t, marker in zip(TIMERS, "osD"):
        pts = [(int(r["flops"]), x) for r in rows if (x := speedup(r, t, "evolved", "torch")) is not None]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=16, marker=marker, alpha=0.75, label=t)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("FLOPs (2MNK)")
    ax.set_ylabel("evolved / torch.matmul speedup")
    ax.set_title("Best evolved kernel vs torch.matmul (best of NN/TN)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOTS[0], dpi=110)
    plt.close(fig)
    written.append(PLOTS[0])

    decades = sorted({decade(int(r["flops"])) for r in rows}, key=lambda d: int(d[2:]))
    refs = [r for r in ("torch", "lt_heuristic", "lt_autotuned", "triton")
            if any(speedup(row, "device", "evolved", r) for row in rows)]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(len(refs), 1)
    for i, ref in enumerate(refs):
        data = [[x for r in rows if decade(int(r["flops"])) == d and (x := speedup(r, "device", "evolved", ref))]
                for d in decades]
        keep = [(j + (i - (len(refs) - 1) / 2) * width, xs) for j, xs in enumerate(data) if xs]
        if keep:
            bp = ax.boxplot([xs for _, xs in keep], positions=[p for p, _ in keep], widths=width * 0.9,
                            patch_artist=True, manage_ticks=False)
            for box in bp["boxes"]:
                box.set_facecolor(f"C{i}")
                box.set_alpha(0.6)
            ax.plot([], [], color=f"C{i}", lw=6, alpha=0.6, label=f"vs {ref}")
    ax.set_xticks(range(len(decades)))
    ax.set_xticklabels(decades)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel("FLOP decade")
    ax.set_ylabel("evolved speedup (device timer)")
    ax.set_title("Evolved kernel vs each peer, per FLOP decade")
    if refs:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / PLOTS[1], dpi=110)
    plt.close(fig)
    written.append(PLOTS[1])

    cells = {(int(r["M"]), int(r["N"]), int(r["K"])): x for r in rows
             if (x := speedup(r, "device", "evolved", "torch")) is not None}
    ks = sorted({k for _, _, k in cells}) or [0]
    ms = sorted({m for m, _, _ in cells})
    ns = sorted({n for _, n, _ in cells})
    cols = min(4, len(ks))
    nrows = -(-len(ks) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols + 1, 3.0 * nrows + 0.6), squeeze=False)
    lim = max([abs(math.log2(x)) for x in cells.values()] + [0.1])
    norm = TwoSlopeNorm(vmin=-lim, vcenter=0.0, vmax=lim)
    image = None
    for idx, k in enumerate(ks):
        ax = axes[idx // cols][idx % cols]
        grid = [[math.log2(cells[(m, n, k)]) if (m, n, k) in cells else float("nan") for n in ns] for m in ms]
        image = ax.imshow(grid or [[float("nan")]], cmap="RdBu", norm=norm, origin="lower", aspect="auto")
        ax.set_title(f"K = {k}", fontsize=9)
        ax.set_xticks(range(len(ns)))
        ax.set_xticklabels(ns, rotation=90, fontsize=6)
        ax.set_yticks(range(len(ms)))
        ax.set_yticklabels(ms, fontsize=6)
        ax.set_xlabel("N", fontsize=7)
        ax.set_ylabel("M", fontsize=7)
    for idx in range(len(ks), nrows * cols):
        axes[idx // cols][idx % cols].axis("off")
    if image is not None:
        bar = fig.colorbar(image, ax=axes, shrink=0.8)
        bar.set_label("log2 speedup vs torch.matmul (device)")
    fig.suptitle("Evolved vs torch.matmul, device timer: M x N per K (blue faster, red slower, blank not measured)",
                 fontsize=9)
    fig.savefig(out / PLOTS[2], dpi=110)
    plt.close(fig)
    written.append(PLOTS[2])
    return written


def write_summary(out: Path, rows: Sequence[dict[str, Any]], meta: dict[str, Any],
                  anchors: Optional[Path]) -> dict[str, Any]:
    """summary.md, summary.json, the plots and (when ``anchors`` is given) cuda_l2_published.csv."""
    rows = [with_speedups(r) for r in rows]
    summary = summarize(rows)
    join = None
    if anchors is not None:
        try:
            join = cuda_l2_join(rows, anchors)
            write_join(out / "cuda_l2_published.csv", join)
            meta = {**meta, "CUDA-L2 join": f"{len(join['rows'])} shared shapes (cuda_l2_published.csv)"}
        except (FileNotFoundError, OSError, ValueError, KeyError) as exc:
            meta = {**meta, "CUDA-L2 join": f"not made: {exc}"}
    else:
        meta = {**meta, "CUDA-L2 join": "not made here (no anchors directory); run --summarize with --cuda-l2"}
    meta = {**meta, "plots": ", ".join(plots(rows, out)) or "none (matplotlib is not installed)"}
    (out / "summary.md").write_text(markdown(summary, meta, join))
    (out / "summary.json").write_text(json.dumps({"meta": meta, "summary": summary,
                                                  "cuda_l2": join["stats"] if join else None}, indent=1, default=str))
    return summary
