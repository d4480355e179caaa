"""The arguments every subcommand shares, defined once (docs/cli.md is the user's view).

The archive is the first positional argument (``--archive`` is the same argument), shapes use
one grammar and help text, ``--arch`` one spelling and the default ``auto``, ``--gpus`` a list
of indices (a count only as ``count:N``), ``--json`` a JSON document instead of the table, and
every failure is one line ``evo CMD: error: ...`` with an exit status from :data:`EXIT`.
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import Any, NoReturn, Optional, Union

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_DAMAGED", "EXIT_INTERRUPTED", "SHAPE_METAVAR",
           "UsageError", "add_archive", "archive_of", "add_shapes", "add_arch", "resolve_arch", "add_gpus",
           "parse_gpus", "gpu_list", "add_json", "fail", "warn", "open_writer", "open_reader", "add_allow_damaged", "count",
           "refuse_damage"]

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_DAMAGED, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
SHAPE_METAVAR = "MxNxK[:TN|NN][:f32|f16]"
SHAPE_HELP = "a shape, MxNxK with optional :TN or :NN layout and :f32 or :f16 contract (default TN, f32)"
ARCH_HELP = "target architecture: sm_80, sm_86, sm_89, sm_90a or auto (default: the visible GPU's, else sm_90a)"
#: The architectures evo targets (the templates' sm_80 code runs on sm_86 and sm_89 too).
KNOWN_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")
_ARCH = re.compile(r"(?:sm_?)?(\d)\.?(\d)(a?)")


class UsageError(ValueError):
    """Bad input to a subcommand: one line on stderr, exit status 2."""


def fail(command: str, message: Union[str, BaseException], code: int = EXIT_BAD_INPUT) -> int:
    """Print ``evo COMMAND: error: MESSAGE`` (one line) on stderr and return ``code`` (always
    EXIT_DAMAGED for an archive too damaged to open, whichever command met it)."""
    from populations import ArchiveDamagedError

    if isinstance(message, ArchiveDamagedError):
        code = EXIT_DAMAGED
    text = " ".join(str(message).split()) or type(message).__name__
    print(f"evo {command}: error: {text}", file=sys.stderr)
    return code


def warn(command: str, message: str) -> None:
    """Print ``evo COMMAND: warning: MESSAGE`` (one line) on stderr."""
    print(f"evo {command}: warning: {' '.join(message.split())}", file=sys.stderr)


# -- the archive --------------------------------------------------------------------------------
def add_archive(p: argparse.ArgumentParser, help: str = "archive directory") -> None:
    """``ARCHIVE`` (positional) or ``--archive ARCHIVE``: one argument, two spellings."""
    p.add_argument("archive_pos", nargs="?", metavar="ARCHIVE", help=help)
    p.add_argument("--archive", dest="archive_opt", metavar="ARCHIVE", help="the same as the positional ARCHIVE")


def archive_of(args: argparse.Namespace, required: bool = True) -> Optional[str]:
    """The archive the user named (either spelling); UsageError when missing, empty or given twice."""
    pos, opt = getattr(args, "archive_pos", None), getattr(args, "archive_opt", None)
    if pos is not None and opt is not None and pos != opt:
        raise UsageError(f"two archives given ({pos!r} and --archive {opt!r}); name one")
    path = pos if pos is not None else opt
    if path is not None and not path.strip():
        raise UsageError("the archive path is empty; name a directory, e.g. runs/a")
    if path is not None and "\0" in path:
        raise UsageError(f"the archive path {path!r} contains a NUL byte")
    if path is None and required:
        raise UsageError("name the archive: evo COMMAND ARCHIVE ... (or --archive ARCHIVE)")
    return path


# -- shapes, arch, gpus, json -----------------------------------------------------------------------
def add_shapes(p: argparse.ArgumentParser, *, required: bool = True, repeat: bool = True, dest: str = "shape") -> None:
    """``--shape S`` in the one grammar of populations.Shape.parse."""
    p.add_argument("--shape", dest=dest, action="append" if repeat else "store", required=required,
                   metavar=SHAPE_METAVAR, help=SHAPE_HELP + (" (repeatable)" if repeat else ""))


def add_arch(p: argparse.ArgumentParser) -> None:
    p.add_argument("--arch", default="auto", metavar="SM", help=ARCH_HELP)


def resolve_arch(text: Optional[str], *, fallback: Optional[str] = "sm_90a") -> Optional[str]:
    """The canonical ``sm_XY[a]`` for any accepted spelling (``sm_90a``, ``sm90a``, ``90a``, ``90``,
    ``9.0``); ``auto`` (or None) is the first visible GPU's architecture, else ``fallback``.
    Compute capability 9.0 always means ``sm_90a`` (the Hopper templates need the ``a`` features)."""
    if text is None or text.lower() == "auto":
        from evaluators import gpu_arch  # nvidia-smi; None where there is no GPU

        return gpu_arch(0) or fallback
    m = _ARCH.fullmatch(text.lower())  # no stripping: 'sm_90a ' is a typo in a script, not sm_90a
    arch = None
    if m:
        major, minor = m.group(1), m.group(2)
        arch = "sm_90a" if (major, minor) == ("9", "0") else f"sm_{major}{minor}{m.group(3)}"
    if arch not in KNOWN_ARCHS:
        raise UsageError(f"--arch {text!r}: write {', '.join(KNOWN_ARCHS)} or auto")
    return arch


def add_gpus(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpus", metavar="LIST", default=None,
                   help="GPU indices, e.g. 0 or 0,1; all (the default) for every visible GPU; "
                        "count:N for the first N visible GPUs")


def parse_gpus(text: Optional[str]) -> Union[None, int, list[int]]:
    """None (every visible GPU), a count (``count:N``) or a list of distinct indices."""
    if text is None or text == "all":
        return None
    if text != text.strip() or not text:
        raise UsageError(f"--gpus {text!r}: a comma-separated list of GPU indices (0,1), all, or count:N "
                         "(no spaces; leave the flag out for every visible GPU)")
    raw = text
    if raw.startswith("count:"):
        try:
            n = int(raw[6:])
        except ValueError:
            n = 0
        if n < 1:
            raise UsageError(f"--gpus {text!r}: count:N needs a whole number N >= 1")
        return n
    try:
        gpus = [int(g) for g in raw.split(",")]
    except ValueError:
        raise UsageError(f"--gpus {text!r}: a comma-separated list of GPU indices (0,1), all, or count:N") from None
    if any(g < 0 for g in gpus) or len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus {text!r}: indices must be distinct and >= 0")
    return gpus


def gpu_list(text: Optional[str]) -> Optional[list[int]]:
    """--gpus as a pool's index list: ``count:N`` is the first N; None for every visible GPU."""
    gpus = parse_gpus(text)
    return list(range(gpus)) if isinstance(gpus, int) else gpus


def open_writer(command: str, path: Any) -> Any:
    """``Archive(path, "w")``, every log checksummed at open, with the damage its opening found
    (torn tails cut and kept in side files, damaged regions, lost records, unreadable shape logs)
    printed as one warning line each instead of Python warnings: a resume is never silent."""
    import warnings

    from populations import Archive

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        archive = Archive(path, mode="w", verify=True)
        problems = archive.problems()
    for problem in problems:
        warn(command, problem)
    return archive


def open_reader(command: str, path: Any, *, verify: bool = True) -> tuple[Any, list[str]]:
    """(``Archive(path, "r")``, its damage): every log opened and (with ``verify``) checksummed end
    to end, each problem printed once as a warning line. ArchiveError propagates."""
    import warnings

    from populations import Archive

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        archive = Archive(path, mode="r", verify=verify)
        try:
            problems = archive.problems()
        except BaseException:
            archive.close()
            raise
    for problem in problems:
        warn(command, problem)
    return archive, problems


def add_allow_damaged(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--allow-damaged", action="store_true",
                   help=f"go on with a damaged archive (exit status 3 without it): the damage is still reported "
                        f"on stderr and {what} lists what was skipped")


def refuse_damage(command: str, path: str, problems: list[str], allow: bool) -> Optional[int]:
    """The exit status refusing a damaged archive (nothing written), or None to go on."""
    if not problems or allow:
        return None
    return fail(command, f"{path}: the archive is damaged ({len(problems)} problem(s) above); nothing written. "
                         f"--allow-damaged goes on without what was lost; evo archive check {path} --repair "
                         "writes a clean copy beside it", EXIT_DAMAGED)


def count(lo: int = 1, hi: int = 10 ** 9) -> Any:
    """An argparse ``type`` for a whole number in ``[lo, hi]``: anything else is a one-line usage error
    naming the limits (a negative count or a 30-digit one is a typo, never a request)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{value} is outside {lo}..{hi:,}")
        return value
    parse.__name__ = "count"  # argparse names the type in its message
    return parse


def add_json(p: argparse.ArgumentParser, what: str = "the result") -> None:
    p.add_argument("--json", action="store_true", help=f"print {what} as one JSON document instead of the table")


class OneLineParser(argparse.ArgumentParser):
    """argparse with usage errors on one line (``evo CMD: error: ...``, then where to look) instead
    of the usage block: the same form as every other error, easy to read in a log."""

    def error(self, message: str) -> "NoReturn":  # type: ignore[override]
        hint = ""
        if "expected one argument" in message:
            hint = " (a value that starts with '-' is written --flag=VALUE)"
        self.exit(EXIT_BAD_INPUT, f"{self.prog}: error: {message}{hint}; see {self.prog} --help\n")


def plain_help(parser: argparse.ArgumentParser) -> None:
    """Strip reStructuredText markup (double and single backticks) and issue references from
    every description, epilog and help string under ``parser``: help is read in a terminal."""
    def clean(text: Any) -> Any:
        if not isinstance(text, str):
            return text
        text = text.replace("``", "").replace("`", "")
        return re.sub(r"\s*\((?:see )?issues? #?\d+\)", "", text)

    stack = [parser]
    while stack:
        p = stack.pop()
        p.description, p.epilog = clean(p.description), clean(p.epilog)
        for action in p._actions:
            action.help = clean(action.help)
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
                for choice in action._choices_actions:
                    choice.help = clean(choice.help)
