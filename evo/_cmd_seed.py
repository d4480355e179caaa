"""``evo seed --shape S [--shape ...] --archive DIR [--per-template N] [--seed INT] [--specialize]``

Fills an archive with a first population per shape, from every seed template that applies to the
shape on the target architecture: the template's cuBLAS-like heuristic picks first (tile by
shape, split-K for small M·N with large K), then valid random samples chosen to be far apart in
the knob space (greedy farthest-point over per-axis distances), de-duplicated, each a
Candidate with operator "seed". Exit status 0 on success, 2 on bad
input (an unparsable shape, an unknown template, a non-positive count).
"""
from __future__ import annotations

import argparse
import random
import sys
from typing import Any, Mapping, Sequence

from populations import Archive, ArchiveError, Candidate, Shape, ShapeError, Template, TemplateError, load_templates
from populations._knobs import KnobSpace, knob_key

__all__ = ["add_parser", "run", "seed_population", "knob_distance", "spread"]

#: How many valid samples to draw per wanted diverse pick before choosing the spread subset.
POOL_FACTOR = 12


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("seed", help="seed an archive with template candidates for some shapes",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("--shape", action="append", required=True, help="MxNxK[:TN|NN][:f32], repeatable")
    p.add_argument("--archive", required=True, help="archive directory (created if absent)")
    p.add_argument("--per-template", type=int, default=8, help="candidates per template and shape (default 8)")
    p.add_argument("--seed", type=int, default=0, help="random seed for the samples (default 0)")
    p.add_argument("--specialize", action="store_true", help="fold M, N, K into the source and plan")
    p.add_argument("--templates", default=None, help="comma-separated template names (default: all that apply)")
    p.add_argument("--arch", default="sm_90a", help="target architecture, e.g. sm_80 or sm_90a (default sm_90a)")
    p.add_argument("--dry-run", action="store_true", help="print the candidates' knobs, write nothing")


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


def run(args: argparse.Namespace) -> int:
    try:
        shapes = [Shape.parse(s) for s in args.shape]
    except ShapeError as exc:
        print(f"evo seed: {exc}", file=sys.stderr)
        return 2
    if args.per_template < 1:
        print(f"evo seed: --per-template must be >= 1, got {args.per_template}", file=sys.stderr)
        return 2
    try:
        templates = load_templates(errors="warn")
    except TemplateError as exc:  # pragma: no cover - errors="warn" skips broken folders
        print(f"evo seed: {exc}", file=sys.stderr)
        return 2
    if args.templates:
        names = [n.strip() for n in args.templates.split(",") if n.strip()]
        unknown = [n for n in names if n not in templates]
        if unknown:
            print(f"evo seed: unknown template(s) {unknown}; known: {sorted(templates)}", file=sys.stderr)
            return 2
        templates = {n: templates[n] for n in names}
    rng = random.Random(args.seed)
    try:
        per_shape = {s: seed_population(s, list(templates.values()), args.per_template, rng,
                                        arch=args.arch, specialize=args.specialize) for s in shapes}
    except TemplateError as exc:
        print(f"evo seed: {exc}", file=sys.stderr)
        return 2
    for s, cands in per_shape.items():
        counts: dict[str, int] = {}
        for c in cands:
            counts[c.template or "?"] = counts.get(c.template or "?", 0) + 1
        print(f"{s}: {len(cands)} candidates ({', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'no template applies'})")
        if args.dry_run:
            for c in cands:
                print(f"  {c.id} {c.template} {c.meta.get('seed')} {dict(c.knobs or {})}")
    if args.dry_run:
        return 0
    try:
        with Archive(args.archive, mode="w") as archive:
            for cands in per_shape.values():
                for c in cands:
                    archive.add(c)
            archive.commit()
    except ArchiveError as exc:
        print(f"evo seed: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {sum(len(c) for c in per_shape.values())} candidates to {args.archive}")
    return 0
