"""The ``evo`` command line.

Each sub-command lives in its own module ``evo._cmd_<name>`` exposing
``add_parser(subparsers) -> None`` and ``run(args) -> int``; modules are imported lazily so
that ``evo inspect`` never pays for CUDA or torch imports.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any, Optional, Sequence

#: sub-command -> module; the order is the order of ``evo --help``.
COMMANDS = {
    "seed": "evo.cli._cmd_seed",
    "run": "evo.cli._cmd_run",
    "eval": "evo.cli._cmd_eval",
    "inspect": "evo.cli._cmd_inspect",
    "archive": "evo.cli._cmd_archive",
    "export": "evo.cli._cmd_export",
    "shapes": "evo.cli._cmd_shapes",
    "report": "evo.cli._cmd_report",
    "propose": "evo.cli._cmd_propose",
    "rl": "evo.cli._cmd_rl",
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


def version() -> str:
    """The installed distribution's version (the checkout's pyproject.toml when not installed)."""
    try:
        from importlib.metadata import PackageNotFoundError, version as dist_version

        return dist_version("evo-hgemm")
    except (ImportError, PackageNotFoundError):  # pragma: no cover - a bare checkout
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    from ._cmd_args import OneLineParser, plain_help

    parser = OneLineParser(prog="evo", description="Evolve HGEMM CUDA kernels per matrix shape. "
                                     "Conventions (archive, shapes, --arch, --gpus, --json, exit codes): docs/cli.md.")
    parser.add_argument("--version", action="version", version=f"evo {version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name, mod in _available().items():
        mod.add_parser(sub)  # type: ignore[attr-defined]
    plain_help(parser)
    return parser


def main(argv: Optional[Sequence[str]] = None, **library: Any) -> int:
    """Run one command line. ``library``: keyword arguments for the sub-command's ``run`` that no
    flag can give, for programs embedding the command line (``evo run`` takes ``pool_factory``,
    the evaluator pool to use; the tests give it their stand-in pool)."""
    from ._cmd_args import EXIT_BAD_INPUT, EXIT_INTERRUPTED, UsageError, fail

    parser = build_parser()
    args = parser.parse_args(argv)
    mod = importlib.import_module(COMMANDS[args.command])
    try:
        code = int(mod.run(args, **library) or 0)  # type: ignore[attr-defined]
        sys.stdout.flush()  # here, so a reader that went away is seen now and not at interpreter exit
        return code
    except BrokenPipeError:  # `evo ... --json | head`: the reader has what it wanted; no message
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except KeyboardInterrupt:
        print("evo: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except UsageError as exc:
        return fail(args.command, exc)
    except OSError as exc:  # a path the OS refused (permissions, a file where a directory must be, /proc):
        # the input's fault, not a bug, so one line naming the path and the problem, never a traceback
        where = exc.filename if exc.filename is not None else ""
        return fail(args.command, f"{where}: {exc.strerror or exc}" if where else (exc.strerror or str(exc)),
                    EXIT_BAD_INPUT)


#: What a shell reports for a command ended by SIGPIPE (128 + 13): ``set -o pipefail`` sees the same
#: status as for any Unix tool whose reader closed the pipe, never the bad-input code.
EXIT_BROKEN_PIPE = 141


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout is not a real file (a test's capture): nothing to quiet
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
