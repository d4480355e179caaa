"""``evo shapes CONFIG [CONFIG ...] [--tokens 1,8,64,512] [--fuse native|all|none] [--format csv|toml] [--out FILE]``

Prints the GEMM shapes of transformers from their configs: a Hugging Face config.json (or a
folder holding one) or a transformers config class name such as LlamaConfig (its defaults;
nothing is downloaded). One row per projection (q, k, v or a fused qkv, o, gate and up or a
fused gate_up, down, lm_head) and token count M, in the layout of nn.Linear (TN; GPT-2's Conv1D
is NN). --format toml writes the shapes list that evo run --config reads. Exit status 0, or 2
with one line on stderr (and no --out file) for a config that cannot be read.
"""
from __future__ import annotations

import json
import sys
from typing import Any

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("shapes", help="the GEMM shapes of a transformer, from its config",
                              description=__doc__.split("\n\n")[1])
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="config.json, a folder with one, or a transformers config class name")
    p.add_argument("--tokens", default="1,8,64,512", help="tokens in flight (M), comma-separated (default 1,8,64,512)")
    p.add_argument("--fuse", default="native", choices=("native", "all", "none"),
                   help="native: the modules transformers builds; all: qkv and gate_up fused; none: all separate")
    p.add_argument("--format", default="csv", choices=("csv", "toml"), help="csv (default) or the TOML evo run --config reads")
    p.add_argument("--archive", default=None, help="with --format toml: the archive the TOML names")
    p.add_argument("--out", default=None, metavar="FILE", help="write here instead of stdout")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON document")


def _fail(what: str, problem: str) -> int:
    print(f"evo shapes: error: {what}: {problem}", file=sys.stderr)
    return 2


def run(args: Any) -> int:
    from populations import atomic_write

    from ._shapes import ShapesError, load_config, model_layers, rows, to_csv, to_toml

    try:
        tokens = [int(t) for t in args.tokens.split(",")]  # '1,,2' is a typo, not 1,2
    except ValueError:
        return _fail("--tokens", f"{args.tokens!r} is not a comma-separated list of whole numbers")
    models = []
    for spec in args.configs:
        try:
            name, cfg = load_config(spec)
            models.append(model_layers(name, cfg, args.fuse))
        except ShapesError as exc:
            return _fail(spec, str(exc).removeprefix(f"{spec}: "))
    try:
        rs = rows(models, tokens)
    except ShapesError as exc:
        return _fail("--tokens", str(exc))
    if args.json:
        text = json.dumps([{"shape": str(r.shape), "m": r.shape.m, "n": r.shape.n, "k": r.shape.k,
                            "layout": r.shape.layout, "model": r.model, "layer": r.layer.role,
                            "module": r.layer.module, "count": r.layer.count, "note": r.layer.note} for r in rs],
                          indent=1) + "\n"
    else:
        text = to_toml(rs, args.archive) if args.format == "toml" else to_csv(rs)
    if args.out is None:
        sys.stdout.write(text)
        return 0
    try:
        atomic_write(args.out, [text.encode()])  # the whole file or none
    except OSError as exc:
        return _fail(args.out, exc.strerror or str(exc))
    print(f"{len(rs)} rows, {len({r.shape for r in rs})} shapes -> {args.out}", file=sys.stderr)
    return 0
