"""``evo seed ARCHIVE --shape S [--shape ...] [--per-template N] [--seed INT] [--specialize] [--arch SM] [--json]``

Fills an archive with a first population per shape, from every seed template that applies to the
shape on the target architecture: the template's cuBLAS-like heuristic picks first (tile by
shape, split-K for small M·N with large K), then valid random samples chosen to be far apart in
the knob space (greedy farthest-point over per-axis distances), de-duplicated, each a
Candidate with operator "seed". Exit status 0 on success, 2 on bad
input (an unparsable shape, an unknown template, a non-positive count, a shape no template
covers on the target architecture: then nothing is written and the message says which
templates cover which layouts, contracts and architectures).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from populations import ArchiveError, Candidate, Shape, ShapeError, TemplateError, load_templates

from ._cmd_args import (UsageError, add_archive, add_arch, add_json, add_shapes, archive_of, fail,
                        open_writer, resolve_arch)
from ._orchestrate import seed_shapes, write_seeds

__all__ = ["add_parser", "run"]

def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("seed", help="seed an archive with template candidates for some shapes",
                              description=__doc__.split("\n\n")[1])
    add_archive(p, "archive directory (created if absent)")
    add_shapes(p)
    p.add_argument("--per-template", type=int, default=8, help="candidates per template and shape (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed for the samples (default 0)")
    p.add_argument("--specialize", action="store_true", help="fold M, N, K into the source and plan")
    p.add_argument("--templates", default=None, help="comma-separated template names (default: all that apply)")
    add_arch(p)
    p.add_argument("--dry-run", action="store_true", help="print the candidates' knobs, write nothing")
    add_json(p, "the candidates per shape")


def _seed(args: argparse.Namespace) -> tuple[str, dict[Shape, list[Candidate]]]:
    """The archive path and the candidates per shape; UsageError for anything that cannot be seeded."""
    path = archive_of(args, required=not args.dry_run)
    try:
        shapes = [Shape.parse(s) for s in args.shape]
    except ShapeError as exc:
        raise UsageError(str(exc)) from None
    if args.per_template < 1:
        raise UsageError(f"--per-template must be >= 1, got {args.per_template}")
    arch = resolve_arch(args.arch)
    templates = load_templates(errors="warn")
    if args.templates:
        names = [n.strip() for n in args.templates.split(",") if n.strip()]
        unknown = [n for n in names if n not in templates]
        if unknown:
            raise UsageError(f"unknown template(s) {unknown}; known: {sorted(templates)}")
        templates = {n: templates[n] for n in names}
    try:
        per_shape = seed_shapes(shapes, templates, args.per_template, seed=args.seed, arch=arch,
                                specialize=args.specialize)
    except (TemplateError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    return path or "", per_shape


def run(args: argparse.Namespace) -> int:
    try:
        path, per_shape = _seed(args)
    except UsageError as exc:
        return fail("seed", exc)
    written = 0
    if not args.dry_run:
        try:
            with open_writer("seed", path) as archive:
                written = write_seeds(archive, per_shape)
        except ArchiveError as exc:
            return fail("seed", exc)
    if args.json:
        doc = {"format": "evo-seed/1", "archive": None if args.dry_run else path, "dry_run": bool(args.dry_run),
               "written": written,
               "shapes": [{"shape": str(s), "candidates": [{"id": c.id, "template": c.template, "origin": c.meta.get("seed"),
                                                            "knobs": dict(c.knobs or {})} for c in cands]}
                          for s, cands in per_shape.items()]}
        json.dump(doc, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return 0
    for s, cands in per_shape.items():
        counts: dict[str, int] = {}
        for c in cands:
            counts[c.template or "?"] = counts.get(c.template or "?", 0) + 1
        print(f"{s}: {len(cands)} candidates ({', '.join(f'{k} {v}' for k, v in sorted(counts.items()))})")
        if args.dry_run:
            for c in cands:
                print(f"  {c.id} {c.template} {c.meta.get('seed')} {dict(c.knobs or {})}")
    if not args.dry_run:
        given = sum(len(c) for c in per_shape.values())
        already = f" ({given - written} of the {given} were already there)" if written < given else ""
        print(f"wrote {written} new candidates to {path}{already}")
    return 0
