"""``evo propose``: what an operator proposes for a shape's current elites, without evaluating.

A debugging tool for operators (the LLM one above all): for each of the top elites at the shape
it builds the parents and the history as ``evo run`` would, asks the operator for ``-n``
proposals and prints each child (its knobs or its source change, the model's answer, tokens and
seconds) or the failure's reason. Nothing is compiled, measured or written to the archive.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from typing import Any

from operators import OperatorContext, ParentView, get_operator

from ._cmd_args import SHAPE_METAVAR, add_archive, add_arch, add_json, archive_of, fail, open_reader, resolve_arch
from ._cmd_run import add_llm_flags, llm_options
from ..search import ConfigError
from populations import Archive, ArchiveError, Shape, ShapeError, load_templates

FORMAT = "evo-propose/1"


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("propose", help="show an operator's proposals for a shape's elites (no evaluation)",
                              description=__doc__.split("\n\n")[1])
    add_archive(p, "archive directory (read only)")
    p.add_argument("--shape", required=True, metavar=SHAPE_METAVAR, help="the shape")
    p.add_argument("--operator", default="llm",
                   help="operator name (default llm; see operators/settings.toml), or optuna (the tpe operator)")
    p.add_argument("--mode", choices=("knobs", "edits", "source"), help="answer format for LLM operators")
    p.add_argument("-n", type=int, default=2, help="proposals per elite (default 2)")
    p.add_argument("--top", type=int, default=3, help="how many elites to use as parents (default 3)")
    add_arch(p)
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    add_json(p, "the evo-propose/1 document")
    add_llm_flags(p)


def _row(parent: ParentView, p: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"parent": parent.id, "parent_speedup": parent.fitness, "ok": p.ok}
    if not p.ok:
        row["reason"] = p.reason
        return row
    c = p.candidate
    changed = {k: v for k, v in (c.knobs or {}).items() if parent.knobs.get(k) != v}
    row.update(id=c.id, template=c.template, changes=changed, model=c.model, model_name=c.meta.get("model_name"),
               completion=c.completion, tokens=c.meta.get("tokens"), seconds=c.meta.get("seconds"),
               temperature=c.meta.get("temperature"))
    return row


def propose(archive: Archive, shape: Shape, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The rows of the report: one per proposal (or failure), parents the top elites in rank order."""
    options = {**llm_options(args), **({"mode": args.mode} if args.mode else {})}
    arch = resolve_arch(args.arch)
    name = operator_name(args.operator)
    op = get_operator(name, **options) if name.startswith("llm") else get_operator(name)
    cands = {c.id: c for c in archive.candidates(shape)}
    history = [(cands[e.candidate_id], e) for e in archive.evaluations(shape) if e.candidate_id in cands]
    context = OperatorContext(history, load_templates(errors="warn"), arch=arch)  # type: ignore[arg-type]
    elites = [e for e in archive.elites(shape, top=args.top) if e.candidate is not None]
    views = [ParentView(e.candidate, e.latest) for e in elites]
    rng = random.Random(args.seed)
    rows = []
    if views and args.operator.startswith("llm"):
        say(f"{args.operator}: the first call loads the model ({', '.join(options.get('models') or ['the default'])}); "
            "that takes seconds to minutes on a CPU")
    for i, parent in enumerate(views):
        parents = [parent] + [v for v in views if v is not parent][:max(op.arity - 1, 0)]
        t0 = time.monotonic()
        say(f"parent {i + 1}/{len(views)} ({parent.id[:12]}): asking {args.operator} for {args.n} proposal(s)")
        got = [_row(parent, p) for p in op.propose(parents[:max(op.arity, 1)], shape, rng, args.n, context)]
        say(f"parent {i + 1}/{len(views)}: {sum(r['ok'] for r in got)} of {len(got)} ok in {time.monotonic() - t0:.1f} s")
        rows += got
    return rows


def operator_name(name: str) -> str:
    """The registered operator ``--operator`` names: an alias of one operator (``optuna``: ``tpe``, as
    in ``evo run --operators``) is that operator; an alias of several is a KeyError naming them."""
    from operators import available_operators

    from ._orchestrate import ALIASES

    members = ALIASES.get(name)
    if members is None or name in available_operators():  # a registered operator ("knob") is itself
        return name
    if len(members) == 1:
        return next(iter(members))
    raise KeyError(f"--operator {name} names a group ({', '.join(members)}); evo propose asks one operator: name one of them")


def say(message: str) -> None:
    """A progress line on stderr (stdout stays the result, --json a document)."""
    print(f"evo propose: {message}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    if args.n < 1 or args.top < 1:
        return fail("propose", "-n and --top must be >= 1")
    try:
        llm_options(args)  # an unknown model fails here, at once and offline
        resolve_arch(args.arch)
        shape = Shape.parse(args.shape)
        archive = open_reader("propose", archive_of(args))[0]  # damage: one warning line each
    except (ShapeError, ArchiveError, ValueError, ConfigError) as exc:
        return fail("propose", exc)
    try:
        rows = propose(archive, shape, args)
    except (KeyError, ImportError, ValueError, TypeError, ConfigError) as exc:  # unknown operator, missing extra, bad option
        return fail("propose", exc.args[0] if isinstance(exc, KeyError) and exc.args else exc)
    finally:
        archive.close()
    if args.json:
        json.dump({"format": FORMAT, "shape": str(shape), "operator": args.operator, "proposals": rows},
                  sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
        return 0
    if not rows:
        print(f"no elite at {shape}: nothing to propose from")
    for r in rows:
        head = f"parent {r['parent']} ({r['parent_speedup']:.3f}x)" if r["parent_speedup"] else f"parent {r['parent']}"
        if not r["ok"]:
            print(f"{head}: failed: {r['reason']}")
            continue
        what = ", ".join(f"{k}={v}" for k, v in r["changes"].items()) or "source change"
        extra = f"  [{r['model']}, {r['tokens']} tokens, {r['seconds']} s] {r['completion']!r}" if r["model"] else ""
        print(f"{head} -> {r['id']}: {what}{extra}")
    return 0
