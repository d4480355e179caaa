"""The ``evo`` command line.

Each sub-command lives in its own module ``evo._cmd_<name>`` exposing
``add_parser(subparsers) -> None`` and ``run(args) -> int``; modules are imported lazily so
that ``evo inspect`` never pays for CUDA or torch imports.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Optional, Sequence

#: sub-command -> module; the order is the order of ``evo --help``.
COMMANDS = {
    "seed": "evo._cmd_seed",
    "run": "evo._cmd_run",
    "eval": "evo._cmd_eval",
    "inspect": "evo._cmd_inspect",
    "export": "evo._cmd_export",
    "shapes": "evo._cmd_shapes",
    "report": "evo._cmd_report",
    "propose": "evo._cmd_propose",
    "rl": "evo._cmd_rl",
}


def _available() -> dict[str, object]:
    mods = {}
    for name, modname in COMMANDS.items():
        try:
            mods[name] = importlib.import_module(modname)
        except ModuleNotFoundError as exc:
            if exc.name != modname:  # a real missing dependency inside the module: surface it
                raise
    return mods


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="evo", description="Evolve HGEMM CUDA kernels per matrix shape.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, mod in _available().items():
        mod.add_parser(sub)  # type: ignore[attr-defined]
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    mod = importlib.import_module(COMMANDS[args.command])
    try:
        return int(mod.run(args) or 0)  # type: ignore[attr-defined]
    except KeyboardInterrupt:
        print("evo: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
