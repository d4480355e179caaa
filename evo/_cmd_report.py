"""``evo report ARCHIVE --out DIR``

Writes a static HTML report of an archive to DIR/index.html: the summary per timer (geomean,
median, min, wins, per FLOP decade), plots as PNG files beside it (speedup vs FLOPs, per-decade
box plots; needs matplotlib), the per-shape table (best speedup per timer, template, knobs,
status counts) and the lineage of each shape's best kernel. No network resources: open it
anywhere. Exit status 0, or 2 with one line on stderr and nothing written for bad input.
"""
from __future__ import annotations

import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("report", help="write a static HTML report of an archive",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("archive", metavar="ARCHIVE", help="archive directory")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (new, or an earlier report to replace)")


def run(args: Any) -> int:
    from populations import ArchiveError

    from ._report import ReportError, build_report

    try:
        index = build_report(args.archive, args.out)
    except (ReportError, ArchiveError) as exc:
        print(f"evo report: {exc}", file=sys.stderr)
        return 2
    print(index)
    return 0
