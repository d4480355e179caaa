"""``evo archive check ARCHIVE [--repair [--out DIR]] [--json]``

Checks an archive end to end: every frame of every shape log checksummed (the side index only
compared against, so records it lists that are gone are found too), every record decoded, and
evaluations whose candidate was lost found. Each problem is one line on stderr naming the file,
offset, bytes and records lost. ``--repair`` then writes a clean copy holding every record that
survived to DIR (default ARCHIVE.repaired, beside it; never the archive itself, which is only
read). Exit status 0 for a whole archive (or a written repair), 3 for a damaged one, 2 for bad
input (not an archive, an existing --out).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._cmd_args import EXIT_BAD_INPUT, EXIT_DAMAGED, UsageError, add_archive, archive_of, fail, warn

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("archive", help="check an archive end to end, or repair it into a clean copy",
                              description=__doc__.split("\n\n")[1])
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    sub.required = True
    c = sub.add_parser("check", help="verify every record; --repair writes a clean copy beside it",
                       description=__doc__.split("\n\n")[1])
    add_archive(c)
    c.add_argument("--repair", action="store_true",
                   help="write every record that survived to a new archive (the damaged one is only read)")
    c.add_argument("--out", metavar="DIR", help="where --repair writes (default: ARCHIVE.repaired, beside it)")
    c.add_argument("--json", action="store_true", help="print the findings as one JSON document")


def run(args: argparse.Namespace) -> int:
    from populations import ArchiveError, check_archive, repair_archive

    try:
        path = archive_of(args)
        if args.out is not None and not args.repair:
            raise UsageError("--out names where --repair writes; add --repair")
        found = check_archive(path)  # type: ignore[arg-type]
    except (ArchiveError, UsageError) as exc:
        return fail("archive", exc, EXIT_BAD_INPUT)
    for problem in found.damage:
        warn("archive", problem)
    doc: dict[str, Any] = {"format": "evo-archive-check/1", "archive": found.path, "ok": found.ok,
                           "shapes": found.shapes, "candidates": found.candidates,
                           "evaluations": found.evaluations, "damage": found.damage, "repair": None}
    repaired = None
    if args.repair and not found.ok:
        try:
            repaired = repair_archive(path, args.out)  # type: ignore[arg-type]
        except ArchiveError as exc:
            return fail("archive", exc, EXIT_BAD_INPUT)
        for dropped in repaired.dropped:
            warn("archive", f"left out of the copy: {dropped}")
        doc["repair"] = {"out": repaired.out, "candidates": repaired.candidates,
                         "evaluations": repaired.evaluations, "dropped": repaired.dropped}
    if args.json:
        json.dump(doc, sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        state = "whole" if found.ok else f"damaged: {len(found.damage)} problem(s)"
        print(f"{found.path}: {state} ({found.shapes} shapes, {found.candidates} candidates and "
              f"{found.evaluations} evaluations readable)")
        if args.repair and found.ok:
            print("nothing to repair")
        if repaired is not None:
            print(f"repaired copy: {repaired.out} ({repaired.candidates} candidates, {repaired.evaluations} "
                  f"evaluations; {len(repaired.dropped)} evaluation(s) left out)")
    if found.ok or repaired is not None:
        return 0
    warn("archive", f"the archive is damaged; exit status {EXIT_DAMAGED}; --repair writes a clean copy")
    return EXIT_DAMAGED
