"""The red-team corpus (issue 5): hostile kernels an LLM rewarded for speed might write.

Each case is ``tests/hostile/<name>.toml`` (data: the plan, the claimed shapes, ``generic``, the
status an honest evaluator must give, the phase that must catch it, the check that should) plus
its CUDA source ``<name>.cu`` (or the file named by ``source``). A source line ``//@embed FILE``
is replaced by that file of the corpus folder, so every hostile kernel is one header-free
translation unit built on the same correct base (``_base.cu``) with the exploit inside.

Files starting with ``_`` are not cases: ``_base.cu`` is the shared base and ``_good.*`` the
honest control kernel the GPU run interleaves with the corpus.

Contract breakers that cannot even become a :class:`populations.Candidate` (a plan outside the
harness's limits, an expression that is not one) say ``raises = "PlanError"``: loading keeps the
error instead of a candidate, and the tests check it is exactly that error.
"""
from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from populations import Candidate, LaunchPlan, Shape, Status

__all__ = ["CORPUS_DIR", "PHASES", "HostileCase", "load_case", "load_corpus", "load_good", "render_source"]

CORPUS_DIR = Path(__file__).resolve().parent / "hostile"
#: Where a case must be caught: before compiling, by the compiler, or on the GPU.
PHASES = ("static", "compile", "runtime")
_EMBED = re.compile(r"^[ \t]*//@embed[ \t]+(\S+)[ \t]*$", re.MULTILINE)
_REQUIRED = ("description", "expected", "phase", "shapes", "check")


@dataclass(frozen=True)
class HostileCase:
    """One attack: its candidate (or the error building it raised) and what must happen to it."""

    name: str
    description: str
    expected: Status               # what an honest evaluator returns; never OK
    phase: str                     # static | compile | runtime
    check: str                     # the evaluator check that should catch it
    acceptable: tuple[Status, ...]  # other statuses that still count as caught (racy attacks)
    shapes: tuple[Shape, ...]
    generic: bool
    source: str
    plan: dict
    raises: Optional[str]          # exception class name building the Candidate must raise
    candidate: Optional[Candidate]
    error: Optional[BaseException]  # what building the Candidate raised, if anything
    hole: Optional[str] = None     # a confirmed gap in the evaluator (GPU runs xfail it, strictly)

    def caught_by(self, status: Status) -> bool:
        """True when ``status`` counts as this attack being caught."""
        return status == self.expected or status in self.acceptable


def render_source(path: Path, _depth: int = 0) -> str:
    """The case's CUDA text with every ``//@embed FILE`` line replaced by that corpus file."""
    if _depth > 4:
        raise ValueError(f"{path.name}: //@embed nested too deep")
    text = path.read_text()

    def embed(match: re.Match[str]) -> str:
        target = (CORPUS_DIR / match.group(1)).resolve()
        if target.parent != CORPUS_DIR:
            raise ValueError(f"{path.name}: //@embed {match.group(1)} is outside the corpus folder")
        return render_source(target, _depth + 1).rstrip("\n")

    return _EMBED.sub(embed, text)


def load_case(toml_path: Path) -> HostileCase:
    """Parse one case's data file and build its Candidate (or record the expected failure)."""
    data = tomllib.loads(toml_path.read_text())
    name = toml_path.stem
    missing = [key for key in _REQUIRED if key not in data]
    if missing:
        raise ValueError(f"{toml_path.name}: missing {', '.join(missing)}")
    expected = Status(data["expected"])
    if expected is Status.OK:
        raise ValueError(f"{toml_path.name}: a hostile case can never expect ok")
    if data["phase"] not in PHASES:
        raise ValueError(f"{toml_path.name}: phase must be one of {PHASES}, got {data['phase']!r}")
    acceptable = tuple(Status(s) for s in data.get("acceptable", ()))
    if Status.OK in acceptable:
        raise ValueError(f"{toml_path.name}: ok is never an acceptable outcome")
    source = render_source(CORPUS_DIR / data.get("source", f"{name}.cu"))
    shapes = tuple(Shape.parse(s) for s in data["shapes"])
    generic = bool(data.get("generic", False))
    plan = data.get("plan", {})
    candidate: Optional[Candidate] = None
    error: Optional[BaseException] = None
    try:
        candidate = Candidate(source=source, plan=LaunchPlan.from_dict(plan), shapes=shapes,
                              generic=generic, operator="redteam", meta={"hostile": name})
    except (ValueError, TypeError) as exc:  # PlanError and ExprError are ValueErrors
        error = exc
    return HostileCase(name=name, description=data["description"], expected=expected,
                       phase=data["phase"], check=data["check"], acceptable=acceptable,
                       shapes=shapes, generic=generic, source=source, plan=plan,
                       raises=data.get("raises"), candidate=candidate, error=error, hole=data.get("hole"))


def load_corpus(directory: Path = CORPUS_DIR) -> list[HostileCase]:
    """Every case of the corpus, sorted by name."""
    return [load_case(p) for p in sorted(directory.glob("*.toml")) if not p.name.startswith("_")]


def load_good(shape: str = "1024x1024x1024") -> Candidate:
    """The honest control: the corpus base as a plain, correct fp32-accumulating HGEMM."""
    data = tomllib.loads((CORPUS_DIR / "_good.toml").read_text())
    return Candidate(source=render_source(CORPUS_DIR / "_good.cu"), plan=LaunchPlan.from_dict(data["plan"]),
                     shapes=(Shape.parse(shape),), generic=bool(data.get("generic", False)),
                     operator="redteam-control")
