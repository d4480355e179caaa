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
import random
import sys
from typing import Any, Mapping, Sequence

from populations import ArchiveError, Candidate, Shape, ShapeError, Template, TemplateError, load_templates
from populations import KnobSpace, knob_key

from ._cmd_args import (UsageError, add_archive, add_arch, add_json, add_shapes, archive_of, fail,
                        open_writer, resolve_arch)

__all__ = ["add_parser", "run", "seed_population", "knob_distance", "spread"]

#: How many valid samples to draw per wanted diverse pick before choosing the spread subset.
POOL_FACTOR = 12


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


def knob_distance(space: KnobSpace, a: Mapping[str, Any], b: Mapping[str, Any]) -> float:
    """Distance between two knob sets: per axis, the mean per-knob distance (ordered numeric
    domains by index distance over the domain's span, others 0/1), summed over axes, so every
    axis (tiling, loops, padding, swizzle, split-K, epilogue, ...) weighs the same."""
    per_axis: dict[str, list[float]] = {}
    for name, knob in space.knobs.items():
        va, vb = a.get(name, knob.default), b.get(name, knob.default)
        if knob.kind == "int" and len(knob.values) > 1:
            order = sorted(knob.values)
            d = abs(order.index(va) - order.index(vb)) / (len(order) - 1)
        else:
            d = 0.0 if va == vb else 1.0
        per_axis.setdefault(knob.axis, []).append(d)
    return sum(sum(ds) / len(ds) for ds in per_axis.values())


def spread(space: KnobSpace, pool: Sequence[Mapping[str, Any]], n: int,
           chosen: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """Greedy farthest-point choice of ``n`` knob sets from ``pool``, far from ``chosen`` and each other."""
    picked: list[dict[str, Any]] = []
    anchors = list(chosen)
    rest = [dict(k) for k in pool]
    if not anchors and rest:
        picked.append(rest.pop(0))
        anchors.append(picked[-1])
    best = [min((knob_distance(space, k, a) for a in anchors), default=0.0) for k in rest]
    while rest and len(picked) < n:
        i = max(range(len(rest)), key=best.__getitem__)
        choice = rest.pop(i)
        best.pop(i)
        picked.append(choice)
        best = [min(d, knob_distance(space, k, choice)) for d, k in zip(best, rest)]
    return picked


def seed_population(shape: Shape, templates: Sequence[Template], per_template: int, rng: random.Random, *,
                    arch: str = "sm_90a", specialize: bool = False) -> list[Candidate]:
    """Heuristic picks, then spread-out valid samples, for every template applicable to ``shape``."""
    out: list[Candidate] = []
    seen: set[str] = set()
    for t in sorted(templates, key=lambda t: t.name):
        if not t.applicable(shape, arch):
            continue
        heur = t.heuristic(shape, arch)[:per_template]
        want = per_template - len(heur)
        samples: list[dict[str, Any]] = []
        if want > 0:
            keys = {knob_key(k) for k in heur}
            pool = [k for k in t.sample(rng, shape, POOL_FACTOR * want, arch) if knob_key(t.space.complete(k)) not in keys]
            samples = spread(t.space, pool, want, heur)
        for origin, knob_sets in (("heuristic", heur), ("sample", samples)):
            for knobs in knob_sets:
                cand = t.candidate(knobs, shape, specialize, operator="seed", meta={"seed": origin})
                if cand.id not in seen:
                    seen.add(cand.id)
                    out.append(cand)
    return out


def coverage(templates: Sequence[Template]) -> str:
    """What the templates cover, for the message of a shape none applies to."""
    return "; ".join(f"{t.name}: {'/'.join(t.layouts)}, {'/'.join(t.contracts)}"
                     + (f", needs {'/'.join(t.arch_features)}" if t.arch_features else "")
                     for t in sorted(templates, key=lambda t: t.name))


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
    rng = random.Random(args.seed)
    try:
        per_shape = {s: seed_population(s, list(templates.values()), args.per_template, rng,
                                        arch=arch, specialize=args.specialize) for s in shapes}
    except TemplateError as exc:
        raise UsageError(str(exc)) from None
    empty = [str(s) for s, cands in per_shape.items() if not cands]
    if empty:
        raise UsageError(f"no template covers {', '.join(empty)} on {arch}, so nothing was written; "
                         f"templates cover {coverage(list(templates.values()))}")
    return path or "", per_shape


def run(args: argparse.Namespace) -> int:
    try:
        path, per_shape = _seed(args)
    except UsageError as exc:
        return fail("seed", exc)
    if not args.dry_run:
        try:
            with open_writer("seed", path) as archive:
                for cands in per_shape.values():
                    for c in cands:
                        archive.add(c)
                archive.commit()
        except ArchiveError as exc:
            return fail("seed", exc)
    if args.json:
        doc = {"format": "evo-seed/1", "archive": None if args.dry_run else path, "dry_run": bool(args.dry_run),
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
        print(f"wrote {sum(len(c) for c in per_shape.values())} candidates to {path}")
    return 0
