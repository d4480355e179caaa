"""``evo report``: a static HTML page of an archive (no network resources, plots as PNG files).

:func:`build_report` reads an archive (without locking it) and writes into a new directory

- ``index.html``: summary per timer (geomean, median, min, share of wins, per FLOP decade), the
  plots, a per-shape table (best speedup per timer, template, knobs, status counts) and the
  lineage of each shape's best kernel (:meth:`Archive.lineage`); CSS inline, from
  ``report_template.html``;
- ``speedup_vs_flops.png`` and ``speedup_per_decade.png`` (matplotlib, Agg), when matplotlib is
  installed; without it the page says so instead of showing them.

The directory is built beside ``out`` and renamed into place (:func:`evo.export._export.staged_dir`),
so a failure leaves nothing.
"""
from __future__ import annotations

import html
import math
import os
import statistics
import time
from collections import defaultdict
from pathlib import Path
from string import Template
from typing import Any, Optional, Sequence, Union

from populations import Archive, LineageNode, Shape, Status

from ..search import evaluation_roofline, load_calibration
from ..export import staged_dir

__all__ = ["ReportError", "build_report", "collect", "TIMERS"]

TEMPLATE = Path(__file__).with_name("report_template.html")
TIMERS = ("device", "offline", "server")  # shown in this order; others follow by name
PLOTS = ("speedup_vs_flops.png", "speedup_per_decade.png")
#: Short column heads for the status counts (the full name is the header's tooltip).
STATUS_ABBR = {"ok": "ok", "rejected": "rej", "compile_error": "c.err", "runtime_error": "r.err",
               "timeout": "t/o", "incorrect": "wrong", "flagged": "flag"}


class ReportError(Exception):
    """Bad input for a report: one line for the user, nothing written."""


# -- data -----------------------------------------------------------------------------------
def collect(archive: Archive) -> list[dict[str, Any]]:
    """One row per shape: its best elite (or None), per-timer speedups and status counts."""
    rows = []
    cal = load_calibration(archive.path)
    for shape in archive.shapes():
        elites = archive.elites(shape, top=1)
        best = elites[0] if elites else None
        cand = best.candidate if best else None
        timers = {n: t.speedup for n, t in best.latest.timers.items()} if best else {}
        rows.append({
            "shape": shape, "flops": shape.flops, "best": best,
            "fitness": best.fitness if best else None, "timers": timers,
            "template": cand.template if cand else None, "knobs": dict(cand.knobs) if cand and cand.knobs else None,
            "operator": cand.operator if cand else None,
            "counts": archive.status_counts(shape), "candidates": len(archive.candidate_ids(shape)),
            "roofline_frac": evaluation_roofline(best.latest, cal) if best else None,  # issue 26
        })
    return rows


def _timer_names(rows: list[dict[str, Any]]) -> list[str]:
    seen = {n for r in rows for n in r["timers"]}
    return [t for t in TIMERS if t in seen] + sorted(seen - set(TIMERS))


def _geomean(xs: list[float]) -> Optional[float]:
    xs = [x for x in xs if x and x > 0 and math.isfinite(x)]
    return math.exp(statistics.fmean(math.log(x) for x in xs)) if xs else None


def _decade(flops: int) -> str:
    return f"1e{int(math.log10(flops))}"


# -- HTML pieces -----------------------------------------------------------------------------
def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def _speed(x: Optional[float]) -> str:
    if x is None or not math.isfinite(x):
        return '<span class="none">&ndash;</span>'
    cls = "win" if x >= 1.0 else "loss"
    return f'<span class="{cls}">{x:.3f}&times;</span>'


def _frac(x: Optional[float]) -> str:
    if x is None or not math.isfinite(x):
        return '<span class="none">&ndash;</span>'
    return f"{x:.2f}"


def _summary(rows: list[dict[str, Any]], timers: list[str]) -> str:
    decades = sorted({_decade(r["flops"]) for r in rows}, key=lambda d: int(d[2:]))
    head = ["timer", "shapes", "geomean", "median", "min", "wins (&ge;1)"] + [f"geomean {d}" for d in decades]
    out = ["<table><tr>" + "".join(f"<th>{h}</th>" for h in head) + "</tr>"]
    for t in timers:
        xs = [r["timers"][t] for r in rows if t in r["timers"]]
        by_dec: dict[str, list[float]] = defaultdict(list)
        for r in rows:
            if t in r["timers"]:
                by_dec[_decade(r["flops"])].append(r["timers"][t])
        cells = [f'<td class="l">{_e(t)}</td>', f"<td>{len(xs)}</td>", f"<td>{_speed(_geomean(xs))}</td>",
                 f"<td>{_speed(statistics.median(xs) if xs else None)}</td>", f"<td>{_speed(min(xs) if xs else None)}</td>",
                 f"<td>{sum(x >= 1 for x in xs)}/{len(xs)}</td>"]
        cells += [f"<td>{_speed(_geomean(by_dec.get(d, [])))}</td>" for d in decades]
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table>")
    none = [str(r["shape"]) for r in rows if r["best"] is None]
    if none:
        out.append(f'<p class="meta">No ok, unflagged kernel yet at {len(none)} shape(s): {_e(", ".join(none))}.</p>')
    return "\n".join(out)


def _shapes_table(rows: list[dict[str, Any]], timers: list[str]) -> str:
    statuses = [s for s in Status]
    head = (['<th class="l">shape</th>', "<th>GFLOP</th>", "<th>fitness</th>",
             '<th title="roofline time / device time (docs/inspect-json.md)">roofline</th>']
            + [f"<th>{_e(t)}</th>" for t in timers]
            + ['<th class="l">template</th>', '<th class="l">operator</th>', '<th class="l">knobs</th>', "<th>cands</th>"]
            + [f'<th title="{_e(s.value)}">{STATUS_ABBR.get(s.value, _e(s.value))}</th>' for s in statuses])
    out = ['<div class="wide"><table><tr>' + "".join(head) + "</tr>"]
    for r in sorted(rows, key=lambda r: (r["flops"], r["shape"])):
        knobs = " ".join(f"{k}={v}" for k, v in (r["knobs"] or {}).items())
        tpl = r["template"] or ("free-form" if r["best"] else "")
        cells = ([f'<td class="l"><a id="{_e(r["shape"].key)}"></a>{_e(r["shape"])}</td>', f"<td>{r['flops'] / 1e9:.3g}</td>",
                  f"<td>{_speed(r['fitness'])}</td>", f"<td>{_frac(r.get('roofline_frac'))}</td>"]
                 + [f"<td>{_speed(r['timers'].get(t))}</td>" for t in timers]
                 + [f'<td class="l">{_e(tpl)}</td>', f'<td class="l">{_e(r["operator"] or "")}</td>',
                    f'<td class="knobs">{_e(knobs)}</td>', f"<td>{r['candidates']}</td>"]
                 + [f"<td>{r['counts'][s] or ''}</td>" for s in statuses])
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</table></div>")
    return "\n".join(out)


def _lineage(archive: Archive, rows: list[dict[str, Any]]) -> str:
    out = []
    for r in sorted(rows, key=lambda r: (r["flops"], r["shape"])):
        if r["best"] is None:
            continue
        shape: Shape = r["shape"]
        fitness = archive.fitness(shape)  # from the ranking summaries: no record decoded
        root: LineageNode = archive.lineage(r["best"].candidate_id, missing_ok=True)  # its record may be lost
        out.append(f"<h3>{_e(shape)} &middot; best {_speed(r['fitness'])}</h3>")
        out.append('<ul class="lineage">')
        for depth, node in root.walk():
            c = node.candidate
            what = (f"{c.operator}, gen {c.generation}, {c.template or 'free-form'}" + (f", {c.model}" if c.model else "")
                    if c else "not in this archive")
            fit = fitness.get(node.candidate_id)
            here = f" &middot; {_speed(fit)} here" if fit is not None else ""
            rep = " (repeated above)" if node.repeated else ""
            arrow = "&larr; " if depth else ""
            out.append(f"<li>{'    ' * depth}{arrow}<code>{_e(node.candidate_id)}</code> {_e(what)}{here}{rep}</li>")
        out.append("</ul>")
    return "\n".join(out) or '<p class="meta">No shape has an ok kernel yet.</p>'


# -- plots -----------------------------------------------------------------------------------
def _finish(plt: Any, fig: Any, ax: Any, path: Path, xlabel: str, ylabel: str, title: str, legend: bool) -> None:
    """The parts both plots share: the parity line, labels, legend, and the PNG."""
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if legend:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plots(rows: list[dict[str, Any]], timers: list[str], out: Path) -> Optional[str]:
    """Write the PNGs; None if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    got = [r for r in rows if r["timers"]]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for t, marker in zip(timers, "osD^v<>"):
        pts = [r for r in got if t in r["timers"]]
        ax.scatter([r["flops"] for r in pts], [r["timers"][t] for r in pts], s=18, marker=marker, label=t, alpha=0.8)
    ax.set_xscale("log")
    _finish(plt, fig, ax, out / PLOTS[0], "FLOPs (2MNK)", "best kernel / baseline speedup",
            "Best kernel per shape vs baseline", bool(timers))

    decades = sorted({_decade(r["flops"]) for r in got}, key=lambda d: int(d[2:]))
    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / max(len(timers), 1)
    for i, t in enumerate(timers):
        data = [[r["timers"][t] for r in got if t in r["timers"] and _decade(r["flops"]) == d] for d in decades]
        pos = [j + (i - (len(timers) - 1) / 2) * width for j in range(len(decades))]
        keep = [(p, d) for p, d in zip(pos, data) if d]
        if keep:
            bp = ax.boxplot([d for _, d in keep], positions=[p for p, _ in keep], widths=width * 0.9,
                            patch_artist=True, manage_ticks=False)
            for box in bp["boxes"]:
                box.set_facecolor(f"C{i}")
                box.set_alpha(0.6)
            ax.plot([], [], color=f"C{i}", lw=6, alpha=0.6, label=t)
    ax.set_xticks(range(len(decades)))
    ax.set_xticklabels(decades)
    _finish(plt, fig, ax, out / PLOTS[1], "FLOP decade", "speedup", "Speedup per FLOP decade", bool(timers))
    return "\n".join(f'<img src="{p}" alt="{p[:-4].replace("_", " ")}">' for p in PLOTS)


# -- the page --------------------------------------------------------------------------------
def _warnings(damage: Sequence[str], rows: list[dict[str, Any]]) -> str:
    """What the reader must know first, at the top of the page: the archive's damage the report went
    on past (what was lost is not shown), and timings that come from a test double, not a GPU."""
    from ..export import from_test_double

    out = []
    if damage:
        items = "\n".join(f"<li>{_e(d)}</li>" for d in damage)
        out.append(f'<div class="damage"><strong>This archive is damaged: {len(damage)} problem(s); what was lost '
                   f'is not in this report.</strong><ul>{items}</ul></div>')
    fake = [str(r["shape"]) for r in rows if r["best"] is not None and from_test_double(r["best"].latest)]
    if fake:
        out.append(f'<div class="damage"><strong>Not measured on a GPU:</strong> the timings of {len(fake)} shape(s) '
                   f'({_e(", ".join(fake))}) come from a test double (provenance pool=fake).</div>')
    return "\n".join(out)


def build_report(archive_path: Union[str, os.PathLike, Archive], out: Union[str, os.PathLike],
                 damage: Sequence[str] = ()) -> Path:
    """Write the report directory ``out`` (new, or an earlier report to replace); returns index.html.
    ``archive_path`` may be an open Archive (the command checks it first and opens it once);
    ``damage`` is the archive's damage the caller chose to go on past, listed on the page."""
    out = Path(out).resolve()
    if out.exists() and not (out / "index.html").is_file():
        raise ReportError(f"{out} exists and is not an evo report; refusing to overwrite it")
    archive = archive_path if isinstance(archive_path, Archive) else Archive(archive_path, "r")  # ArchiveError propagates
    rows = collect(archive)
    timers = _timer_names(rows)
    with staged_dir(out) as tmp:
        plots = _plots(rows, timers, tmp)
        try:
            from evaluators import code_version

            version = code_version()
        except Exception:  # pragma: no cover - best effort
            version = "unknown"
        page = Template(TEMPLATE.read_text()).substitute(
            title=_e(os.path.basename(archive.path)), archive=_e(archive.path), nshapes=len(rows), damage=_warnings(damage, rows),
            generated=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), version=_e(version),
            summary=_summary(rows, timers),
            plots=plots or '<p class="meta">matplotlib is not installed: no plots.</p>',
            shapes=_shapes_table(rows, timers), lineage=_lineage(archive, rows))
        (tmp / "index.html").write_text(page, encoding="utf-8")
    return out / "index.html"
