"""``evo report ARCHIVE --out DIR``

Writes a static HTML report of an archive to DIR/index.html: the summary per timer (geomean,
median, min, wins, per FLOP decade), plots as PNG files beside it (speedup vs FLOPs, per-decade
box plots; needs matplotlib), the per-shape table (best speedup per timer, template, knobs,
status counts) and the lineage of each shape's best kernel. No network resources: open it
anywhere. Every log is checksummed first: damage is reported on stderr and refused (exit 3, nothing
written) unless --allow-damaged, which reports what survived and lists the damage on the page.
Exit status 0, or 2 with one line on stderr and nothing written for bad input, an
unwritable DIR or an archive without a single evaluation; 3 for a damaged archive.
"""
from __future__ import annotations

from typing import Any

from ._cmd_args import add_allow_damaged, add_archive, archive_of, fail, open_reader, refuse_damage

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("report", help="write a static HTML report of an archive",
                              description=__doc__.split("\n\n")[1])
    add_archive(p)
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (new, or an earlier report to replace)")
    add_allow_damaged(p, "the page")


def _has_evaluations(archive: Any, path: str) -> None:
    """ValueError saying what would work when the archive has nothing to report."""
    if not any(sum(archive.status_counts(s).values()) for s in archive.shapes()):
        raise ValueError(f"{path}: nothing to report: the archive has no evaluations "
                         f"({len(archive.shapes())} shape(s)); evaluate kernels first (evo run {path} --shape ...)")


def run(args: Any) -> int:
    from populations import ArchiveError

    from ._report import ReportError, build_report

    archive = None
    try:
        path = archive_of(args)
        archive, problems = open_reader("report", path)
        refused = refuse_damage("report", path, problems, args.allow_damaged)  # type: ignore[arg-type]
        if refused is not None:
            return refused
        _has_evaluations(archive, path)  # type: ignore[arg-type]
        index = build_report(archive, args.out, damage=problems)
    except (ReportError, ArchiveError, ValueError) as exc:
        return fail("report", exc)
    except OSError as exc:
        return fail("report", f"--out {args.out}: cannot write the report there: {exc.strerror or exc}")
    finally:
        if archive is not None:
            archive.close()
    print(index)
    return 0
