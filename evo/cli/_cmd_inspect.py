"""``evo inspect ARCHIVE [--shape S] [--top N] [--lineage ID] [--json | --csv] [--width N] [--allow-damaged]``

Reads an archive (without locking it or writing anything) and shows, per shape, the best
speedup over cuBLAS, how many evaluations ended in each status, and the elite table: one row
per candidate ranked by its median device-timer speedup over its ok, unflagged measurements,
with the timings of its latest such measurement. ``--lineage ID`` (a unique id prefix will do)
shows a candidate's ancestry across shapes instead. ``--json`` prints the stable document of
docs/inspect-json.md (``"format": "evo-inspect/1"``); ``--csv`` prints the table rows.
Tables fit the terminal's width (``--width N`` sets it; 200 columns when not a terminal).
Exit status 0; 2 with a one-line message on stderr (and nothing on stdout) for bad input:
a missing directory, a directory that is not an archive, a bad shape, an unknown id; 3 when
the archive is damaged (a torn tail, damaged or undecodable records, records the side index lists
that are gone, an unreadable or missing shape log): what could be read is printed, each problem is
a warning on stderr, and ``--allow-damaged`` makes that exit 0. Every frame is checksummed at open;
``--fast`` trusts each log's side index instead (quicker on a big archive: damage inside the
indexed part then shows only where a record read hits it).
"""
from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import warnings
from typing import Any, Optional

from populations import Archive, ArchiveError, Elite, LineageNode, Shape, ShapeError, Status

from ..search import evaluation_roofline, load_calibration
from ._cmd_args import EXIT_BAD_INPUT, EXIT_DAMAGED, SHAPE_METAVAR, UsageError, add_archive, archive_of, fail, warn

__all__ = ["add_parser", "run", "build_report", "FORMAT"]

FORMAT = "evo-inspect/1"
TIMER_ORDER = ("device", "offline")  # shown first, in this order; any others follow by name


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("inspect", help="show an archive's elites, statuses and lineage",
                              description=__doc__.split("\n\n")[1])
    add_archive(p)
    p.add_argument("--shape", action="append", metavar=SHAPE_METAVAR, help="only this shape (repeatable)")
    p.add_argument("--top", default="10", help="elite rows per shape (default 10)")
    p.add_argument("--lineage", metavar="ID", help="show the ancestry of one candidate (id or unique prefix)")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the evo-inspect/1 JSON document")
    fmt.add_argument("--csv", action="store_true", help="print the rows as CSV")
    p.add_argument("--width", type=int, metavar="N", help="table width in columns (default: the terminal's; 200 when piped)")
    p.add_argument("--fast", action="store_true",
                   help="trust each log's side index instead of checksumming every frame (damage in unread records "
                        "may then go unseen; evo archive check verifies everything)")
    p.add_argument("--allow-damaged", action="store_true",
                   help="exit 0 even when the archive is damaged (the damage is still reported on stderr)")


class InputError(Exception):
    """Bad input: reported on one line, exit status 2."""


# -- the report (the --json document; every other view renders it) --------------------------
def _num(x: Optional[float]) -> Optional[float]:
    """A float for JSON: NaN and infinities (a broken timer) become null, never invalid JSON."""
    return x if x is None or math.isfinite(x) else None


def _timer(t: Any) -> dict[str, Any]:
    return {"median_s": _num(t.median), "lo_s": _num(t.lo), "hi_s": _num(t.hi),
            "baseline_median_s": _num(t.baseline_median), "speedup": _num(t.speedup),
            "samples": t.samples, "baseline": t.baseline_name}


def _elite(rank: int, e: Elite) -> dict[str, Any]:
    c, last = e.candidate, e.latest
    return {
        "rank": rank, "id": e.candidate_id, "found": c is not None,
        "template": c.template if c else None, "knobs": dict(c.knobs) if c and c.knobs is not None else None,
        "operator": c.operator if c else None, "generation": c.generation if c else None,
        "fitness": _num(e.fitness), "measurements": len(e.evaluations),
        "registers": last.registers, "spills": last.spills, "arch": last.arch, "max_error": _num(last.max_error),
        "timers": {name: _timer(t) for name, t in sorted(last.timers.items())},
    }


def _shape_report(archive: Archive, shape: Shape, top: int) -> dict[str, Any]:
    elites = archive.elites(shape, top=top)
    counts = archive.status_counts(shape)
    rows = [_elite(i + 1, e) for i, e in enumerate(elites)]
    cal = load_calibration(archive.path)
    for row, e in zip(rows, elites):  # issue 26: the roofline fraction of the latest ok measurement
        row["roofline_frac"] = _num(evaluation_roofline(e.latest, cal))
    return {
        "shape": str(shape),
        "candidates": len(archive.candidate_ids(shape)),
        "evaluations": sum(counts.values()),
        "status_counts": {s.value: counts[s] for s in Status},
        "best_speedup": _num(elites[0].fitness) if elites else None,
        "best_roofline_frac": rows[0]["roofline_frac"] if rows else None,
        "elites": rows,
        "adapters": _adapters(archive, shape),
    }


def _adapters(archive: Archive, shape: Shape) -> list[dict[str, Any]]:
    """Improvement per adapter version of the LLM-made candidates (evo.rl; [] when there are none)."""
    from ..rl import adapter_stats

    return [{k: _num(v) if isinstance(v, float) else v for k, v in row.items()} for row in adapter_stats(archive, shape)]


def _lineage_report(tree: LineageNode) -> dict[str, Any]:
    nodes = []
    for _depth, node in tree.walk():
        if node.repeated:
            continue
        c = node.candidate
        nodes.append({"id": node.candidate_id, "found": c is not None,
                      "template": c.template if c else None, "operator": c.operator if c else None,
                      "generation": c.generation if c else None, "model": c.model if c else None,
                      "shapes": [str(s) for s in node.shapes], "parents": list(c.parents) if c else []})
    return {"root": tree.candidate_id, "nodes": nodes}


def build_report(archive: Archive, shapes: Optional[list[Shape]], top: int,
                 lineage: Optional[str] = None) -> tuple[dict[str, Any], Optional[LineageNode]]:
    """The evo-inspect/1 document (and the lineage tree, for rendering). Raises InputError."""
    present = archive.shapes()
    for s in shapes or ():
        if s not in present:
            raise InputError(f"no population for shape {s} in {archive.path}")
    tree = None
    if lineage is not None:
        try:
            tree = archive.lineage(lineage)
        except KeyError as exc:
            raise InputError(exc.args[0] if exc.args else str(exc)) from None
    chosen = shapes if shapes else ([] if lineage is not None else present)
    report = {"format": FORMAT, "archive": archive.path, "calibration": load_calibration(archive.path).to_dict(),
              "shapes": [_shape_report(archive, s, top) for s in chosen],
              "lineage": _lineage_report(tree) if tree is not None else None}
    return report, tree


# -- rendering ----------------------------------------------------------------------------------
def _timer_names(rows: list[dict[str, Any]]) -> list[str]:
    names = {n for r in rows for n in r["timers"]}
    return [n for n in TIMER_ORDER if n in names] + sorted(names - set(TIMER_ORDER))


def _knobs_text(knobs: Optional[dict[str, Any]]) -> str:
    return " ".join(f"{k}={v}" for k, v in knobs.items()) if knobs else "-"


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def render_csv(report: dict[str, Any], tree: Optional[LineageNode], out: Any) -> None:
    """Elite rows (one per shape and rank), or with only a lineage, one row per tree node."""
    w = csv.writer(out, lineterminator="\n")
    if tree is not None and not report["shapes"]:
        w.writerow(["depth", "id", "child", "found", "repeated", "template", "operator", "generation", "shapes"])
        for depth, child, node in _walk_with_child(tree):
            c = node.candidate
            w.writerow([depth, node.candidate_id, child or "", c is not None, node.repeated, c.template if c else "",
                        c.operator if c else "", c.generation if c else "", " ".join(str(s) for s in node.shapes)])
        return
    rows = [(s["shape"], e) for s in report["shapes"] for e in s["elites"]]
    timers = _timer_names([e for _, e in rows])
    w.writerow(["shape", "rank", "id", "template", "operator", "generation", "fitness", "measurements",
                "registers", "spills", "knobs", "roofline_frac"]
               + [f"{t}_{k}" for t in timers for k in ("median_s", "baseline_median_s", "speedup")])
    for shape, e in rows:
        w.writerow([shape, e["rank"], e["id"], e["template"] or "", e["operator"] or "", e["generation"],
                    repr(e["fitness"]), e["measurements"], e["registers"], e["spills"],
                    json.dumps(e["knobs"], sort_keys=True) if e["knobs"] is not None else "",
                    repr(e["roofline_frac"]) if e.get("roofline_frac") is not None else ""]
                   + [repr(e["timers"][t][k]) if t in e["timers"] else ""
                      for t in timers for k in ("median_s", "baseline_median_s", "speedup")])


def _walk_with_child(tree: LineageNode) -> list[tuple[int, Optional[str], LineageNode]]:
    """(depth, id of the node it hangs under, node), in the tree's depth-first order: the node
    a node hangs under is the last one seen one level up."""
    out: list[tuple[int, Optional[str], LineageNode]] = []
    path: list[str] = []
    for depth, node in tree.walk():
        del path[depth:]
        out.append((depth, path[-1] if path else None, node))
        path.append(node.candidate_id)
    return out


def _node_label(node: LineageNode) -> str:
    c = node.candidate
    if c is None:
        return f"{node.candidate_id[:12]}  (not in this archive)"
    bits = [node.candidate_id[:12], c.operator, f"gen {c.generation}"]
    if c.template:
        bits.append(c.template)
    if c.model:
        bits.append(c.model)
    bits.append(", ".join(str(s) for s in node.shapes))
    return "  ".join(bits) + ("  (repeated above)" if node.repeated else "")


def render_lineage_text(tree: LineageNode) -> str:
    return "\n".join("  " * depth + ("<- " if depth else "") + _node_label(node) for depth, node in tree.walk()) + "\n"


def table_width(out: Any, width: Optional[int] = None) -> int:
    """Columns for the tables: ``width`` if given, else the terminal's (COLUMNS, then the tty's
    size), else 200 (piped output is read in editors and logs, not cut to 80)."""
    if width:
        return width
    if out.isatty():
        import shutil

        return shutil.get_terminal_size((200, 24)).columns
    return 200


def render_rich(report: dict[str, Any], tree: Optional[LineageNode], out: Any, width: Optional[int] = None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table
    from rich.tree import Tree

    terminal = out.isatty()
    console = Console(file=out, width=table_width(out, width), no_color=not terminal, highlight=False)
    for s in report["shapes"]:
        best = "no elite yet" if s["best_speedup"] is None else f"best {s['best_speedup']:.3f}x vs cuBLAS"
        console.print(f"[bold]{escape(s['shape'])}[/bold]  {best}  "
                      f"({s['candidates']} candidates, {s['evaluations']} evaluations)")
        statuses = "  ".join(f"{k} {v}" for k, v in s["status_counts"].items() if v)
        console.print("  " + (statuses or "no evaluations"))
        for a in s.get("adapters") or ():
            share = "-" if a["improved_share"] is None else f"{a['improved_share']:.0%}"
            console.print(f"  llm adapter {escape(a['adapter'])}: {a['proposals']} proposals, {a['evaluated']} evaluated, "
                          f"{a['ok']} ok, {a['improved']} improved on their parent ({share}), "
                          f"best {_fmt(a['best'], '.3f')}x, mean reward {_fmt(a['mean_reward'], '+.3f')}")
        if not s["elites"]:  # "no elite yet" said it: no ok, unflagged measurement
            console.print()
            continue
        timers = _timer_names(s["elites"])
        table = Table(show_edge=False, pad_edge=False)
        for col in ["#", "id", "template", "knobs", "regs", "spills", "n", "speedup", "roof"]:
            table.add_column(col, justify="right" if col in ("#", "regs", "spills", "n", "speedup", "roof") else "left")
        for t in timers:
            table.add_column(f"{t} us", justify="right")
            table.add_column(f"{t} x", justify="right")
        for e in s["elites"]:
            cells = [str(e["rank"]), e["id"][:12], e["template"] or "-", _knobs_text(e["knobs"]),
                     str(e["registers"]), str(e["spills"]), str(e["measurements"]), _fmt(e["fitness"], ".3f"),
                     _fmt(e.get("roofline_frac"), ".2f")]
            for t in timers:
                tr = e["timers"].get(t)
                cells += [_fmt(tr and tr["median_s"] * 1e6, ".2f"), _fmt(tr and tr["speedup"], ".3f")]
            table.add_row(*map(escape, cells))
        console.print(table)
        console.print()
    if tree is not None:
        if not terminal:
            out.write(render_lineage_text(tree))
            return
        root = Tree(escape(_node_label(tree)))
        stack = [(root, tree)]
        while stack:
            branch, node = stack.pop()
            for parent in node.parents:
                stack.append((branch.add(escape(_node_label(parent))), parent))
        console.print(root)


# -- the command ------------------------------------------------------------------------------
def _parse(args: argparse.Namespace) -> tuple[Optional[list[Shape]], int]:
    try:
        shapes = [Shape.parse(s) for s in args.shape] if args.shape else None
    except ShapeError as exc:
        raise InputError(str(exc)) from None
    try:
        top = int(args.top)
    except ValueError:
        raise InputError(f"--top must be a whole number, got {args.top!r}") from None
    if top < 1:
        raise InputError(f"--top must be at least 1, got {top}")
    if args.width is not None and args.width < 40:
        raise InputError(f"--width must be at least 40 columns, got {args.width}")
    return shapes, top


def run(args: argparse.Namespace) -> int:
    try:
        shapes, top = _parse(args)
        path = archive_of(args)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the damage is reported below, from Archive.problems()
            archive = Archive(path, mode="r", verify=not args.fast)  # type: ignore[arg-type]
            try:
                report, tree = build_report(archive, shapes, top, args.lineage)
                problems = archive.problems(all_shapes=shapes is None and args.lineage is None)
            finally:
                archive.close()
    except (InputError, ArchiveError, UsageError) as exc:
        return fail("inspect", exc, EXIT_BAD_INPUT)
    for problem in problems:  # damage the reader skipped: say so, one line each
        warn("inspect", problem)
    if args.json:
        json.dump(report, sys.stdout, indent=2, allow_nan=False)
        sys.stdout.write("\n")
    elif args.csv:
        render_csv(report, tree, sys.stdout)
    else:
        render_rich(report, tree, sys.stdout, args.width)
    if problems and not args.allow_damaged:
        warn("inspect", f"the archive is damaged ({len(problems)} problem(s) above); exit status {EXIT_DAMAGED} "
                        "(--allow-damaged: 0)")
        return EXIT_DAMAGED
    return 0
