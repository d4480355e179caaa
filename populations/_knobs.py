"""Knob spaces: the tunable parameters of a seed template, as data.

A :class:`KnobSpace` holds the knobs (each a finite domain), derived integer expressions of the
knobs (and of ``M``, ``N``, ``K`` where they must be), and constraints with the reason each one
exists. Every knob set is checked here, before anything is rendered or compiled, so an invalid
combination is refused with a sentence a person (or an LLM operator) can act on.

Knob values are ints, bools or strings. In expressions (and in the ``#define`` header) a bool
is 0/1 and a string is its index in the knob's ``values``; each string value ``v`` of knob
``X`` also binds the name ``X_v`` to its index, so ``EPI == EPI_smem`` reads the same in a
constraint and in ``#if`` of the CUDA source.

Two kinds of context beyond the knobs: ``LAYOUT_TN``/``LAYOUT_NN`` (1/0 by the shape's layout;
derived values and constraints may use them, and a rendered candidate knows its layout) and
``ARCH`` (the target's compute capability, e.g. 80 or 90; constraints only, since a rendered
source must not depend on it). A derived value or constraint that needs a name not known at
check time (M, N, K or a layout without a shape, ARCH without an arch) is skipped until it is.
"""
from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ._expr import ExprError, check_expr, evaluate, names_in
from ._shape import Shape

__all__ = ["AXES", "SHAPE_NAMES", "LAYOUT_NAMES", "ARCH_NAME", "Knob", "Constraint", "KnobSpace", "TemplateError",
           "KnobValue", "knob_key", "LITERALS", "layout_env"]

KnobValue = Any  # int | bool | str
#: The four search axes of the brief plus a few more; each knob belongs to one.
AXES = ("tiling", "loops", "padding", "swizzle", "splitk", "epilogue", "schedule", "other")
SHAPE_NAMES = frozenset({"M", "N", "K"})
#: 1 for the shape's layout, 0 for the other; bound once a shape (or a layout) is known.
LAYOUT_NAMES = frozenset({"LAYOUT_TN", "LAYOUT_NN"})
#: The target's compute capability (80, 90...); bound in constraints when an arch is given.
ARCH_NAME = "ARCH"
#: ``when = "true"`` reads naturally in TOML; these two names are bound everywhere.
LITERALS = {"true": 1, "false": 0}
_RESERVED = SHAPE_NAMES | LAYOUT_NAMES | set(LITERALS) | {ARCH_NAME, "lda", "ldb", "ldc", "ldsa", "ldsb",
                                                                   "A", "B", "C", "workspace", "stagedA", "stagedB"}


def layout_env(layout: str) -> dict[str, int]:
    """``{"LAYOUT_TN": 1, "LAYOUT_NN": 0}`` for ``"TN"`` (and the reverse for ``"NN"``)."""
    return {name: int(name == f"LAYOUT_{layout}") for name in sorted(LAYOUT_NAMES)}


class TemplateError(ValueError):
    """A template folder, a knob set or a render request that is invalid; the message says why."""


@dataclass(frozen=True)
class Knob:
    """One tunable parameter with a finite domain."""

    name: str
    values: tuple[KnobValue, ...]
    default: KnobValue
    axis: str = "other"
    doc: str = ""

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name in _RESERVED:
            raise TemplateError(f"knob name {self.name!r} must be a C identifier and not one of {sorted(_RESERVED)}")
        if not self.values:
            raise TemplateError(f"knob {self.name}: values must be a non-empty list")
        kinds = {_kind(v) for v in self.values}
        if len(kinds) != 1 or None in kinds:
            raise TemplateError(f"knob {self.name}: values must all be ints, all bools or all strings, got {list(self.values)}")
        if len(set(self.values)) != len(self.values):
            raise TemplateError(f"knob {self.name}: duplicate values in {list(self.values)}")
        if self.kind == "str" and not all(v.isidentifier() for v in self.values):
            raise TemplateError(f"knob {self.name}: string values must be identifiers, got {list(self.values)}")
        if _kind(self.default) != self.kind or self.default not in self.values:
            raise TemplateError(f"knob {self.name}: default {self.default!r} is not one of its values {list(self.values)}")
        if self.axis not in AXES:
            raise TemplateError(f"knob {self.name}: axis {self.axis!r} is not one of {AXES}")

    @property
    def kind(self) -> str:
        return _kind(self.values[0])  # type: ignore[return-value]

    def as_int(self, value: KnobValue) -> int:
        """The value as the integer that expressions and the ``#define`` header see."""
        if self.kind == "str":
            return self.values.index(value)
        return int(value)

    def aliases(self) -> dict[str, int]:
        """``NAME_value -> index`` for string knobs (empty otherwise)."""
        if self.kind != "str":
            return {}
        return {f"{self.name}_{v}": i for i, v in enumerate(self.values)}


@functools.lru_cache(maxsize=4096)
def _names(text: str) -> frozenset[str]:
    return names_in(text)


def _kind(value: Any) -> Optional[str]:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, str):
        return "str"
    return None


@dataclass(frozen=True)
class Constraint:
    """A boolean expression that must hold, and the reason shown when it does not."""

    expr: str
    reason: str


@dataclass(frozen=True)
class KnobSpace:
    """Knobs, derived expressions (in order) and constraints of one template."""

    knobs: Mapping[str, Knob]
    derived: Mapping[str, str] = field(default_factory=dict)
    constraints: tuple[Constraint, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set(self.knobs)
        for knob in self.knobs.values():
            for alias in knob.aliases():
                if alias in seen:
                    raise TemplateError(f"knob {knob.name}: value name {alias} clashes with another knob or value name")
                seen.add(alias)
        names = set(self.knobs) | set(self.aliases())
        for name, expr in self.derived.items():
            if not name.isidentifier() or name in _RESERVED or name in names:
                raise TemplateError(f"derived name {name!r} clashes with a knob or a reserved name, or is not an identifier")
            try:
                check_expr(expr, names | SHAPE_NAMES | LAYOUT_NAMES)
            except ExprError as exc:
                raise TemplateError(f"derived {name}: {exc}") from None
            names.add(name)
        for c in self.constraints:
            if not c.reason.strip():
                raise TemplateError(f"constraint {c.expr!r} needs a reason")
            try:
                check_expr(c.expr, names | SHAPE_NAMES | LAYOUT_NAMES | {ARCH_NAME})
            except ExprError as exc:
                raise TemplateError(f"constraint {c.expr!r}: {exc}") from None

    # -- names ----------------------------------------------------------------------------
    def aliases(self) -> dict[str, int]:
        out: dict[str, int] = dict(LITERALS)
        for knob in self.knobs.values():
            out.update(knob.aliases())
        return out

    @property
    def names(self) -> frozenset[str]:
        """Every name a derived value or plan expression of this space may use (shape and layout names included)."""
        return frozenset(self.knobs) | frozenset(self.aliases()) | frozenset(self.derived) | SHAPE_NAMES | LAYOUT_NAMES

    def shape_dependent(self) -> frozenset[str]:
        """Derived names whose value needs M, N or K."""
        return _dependent(tuple(self.derived.items()), SHAPE_NAMES)

    def layout_dependent(self) -> frozenset[str]:
        """Derived names whose value needs the layout (``LAYOUT_TN``/``LAYOUT_NN``)."""
        return _dependent(tuple(self.derived.items()), LAYOUT_NAMES)

    # -- knob sets ------------------------------------------------------------------------
    def defaults(self) -> dict[str, KnobValue]:
        return {name: k.default for name, k in self.knobs.items()}

    def complete(self, knobs: Mapping[str, KnobValue]) -> dict[str, KnobValue]:
        """``knobs`` with every missing knob at its default. Unknown names are kept (check() refuses them)."""
        out = self.defaults()
        out.update(knobs)
        return out

    def env(self, knobs: Mapping[str, KnobValue], shape: Optional[Shape] = None,
            failed: Optional[dict[str, str]] = None, *, layout: Optional[str] = None,
            arch: Optional[int] = None) -> dict[str, int]:
        """Integer bindings of knobs, aliases, context and derived values.

        Shape-dependent derived values appear only with a shape, layout-dependent ones only with
        a shape or a ``layout``; ``ARCH`` only with an ``arch`` (compute capability). A derived
        value that cannot be computed (``cdiv`` by zero...) raises :class:`ExprError`, or, when
        ``failed`` is given, is left out and recorded there with the error.
        """
        full = self.complete(knobs)
        env: dict[str, int] = dict(self.aliases())
        for name, knob in self.knobs.items():
            env[name] = knob.as_int(full[name])
        if shape is not None:
            env.update(shape.env())
            layout = shape.layout
        if layout is not None:
            env.update(layout_env(layout))
        if arch is not None:
            env[ARCH_NAME] = int(arch)
        dependent = (self.shape_dependent() if shape is None else frozenset()) | \
            (self.layout_dependent() if layout is None else frozenset())
        for name, expr in self.derived.items():
            if name in dependent:
                continue
            if failed is not None and _names(expr) & failed.keys():
                failed[name] = f"needs {sorted(_names(expr) & failed.keys())}"
                continue
            try:
                env[name] = evaluate(expr, env)
            except ExprError as exc:
                if failed is None:
                    raise
                failed[name] = str(exc)
        return env

    def check(self, knobs: Mapping[str, KnobValue], shape: Optional[Shape] = None,
              arch: Optional[int] = None) -> list[str]:
        """Reasons the knob set is invalid (for this shape and arch, when given); empty when it is valid.

        Without a shape, constraints that mention M, N, K or the layout (or derived values that
        do) are skipped; without an arch, those that mention ``ARCH``: they are checked again
        when the shape or the arch is known.
        """
        reasons = []
        for name, value in knobs.items():
            knob = self.knobs.get(name)
            if knob is None:
                reasons.append(f"unknown knob {name!r} (known: {', '.join(self.knobs)})")
            elif _kind(value) != knob.kind or value not in knob.values:
                reasons.append(f"{name}={value!r} is not one of {list(knob.values)}")
        if reasons:
            return reasons
        failed: dict[str, str] = {}
        env = self.env(knobs, shape, failed, arch=arch)
        for c in self.constraints:
            if _names(c.expr) & failed.keys():
                continue  # reported below unless another constraint already explains it
            if not _names(c.expr) <= env.keys():
                continue  # needs a shape
            try:
                ok = evaluate(c.expr, env)
            except ExprError as exc:
                reasons.append(f"{c.reason} ({exc})")
                continue
            if not ok:
                reasons.append(c.reason)
        if failed and not reasons:
            reasons = [f"derived {n} cannot be computed: {e}" for n, e in failed.items()]
        return reasons

    def is_valid(self, knobs: Mapping[str, KnobValue], shape: Optional[Shape] = None,
                 arch: Optional[int] = None) -> bool:
        return not self.check(knobs, shape, arch)

    def random(self, rng: random.Random) -> dict[str, KnobValue]:
        """One knob set drawn uniformly per knob (not necessarily valid)."""
        return {name: rng.choice(k.values) for name, k in self.knobs.items()}

    def sample(self, rng: random.Random, shape: Optional[Shape], n: int, *, max_tries: int = 20000,
               exclude: Sequence[Mapping[str, KnobValue]] = (), arch: Optional[int] = None) -> list[dict[str, KnobValue]]:
        """Up to ``n`` distinct valid knob sets drawn at random (fewer if the space is small).

        Rejection sampling first (uniform per knob, so uniform over the valid sets) for
        :data:`REJECTION_TRIES` tries; where that leaves the sample short, each later draw that is
        invalid redraws, up to :data:`REDRAWS` times, one knob that a violated constraint names
        (through derived values), keeping a redraw that breaks no more constraints than before.
        Pure rejection found 2 valid sets in 3,000 draws of sm90_wgmma in NN (its BN admits 4
        widths of 32 there, its two cluster knobs 3 of their 4 pairs): too few for seeding and the
        random operator. The redraws are biased (towards knob values that break fewer
        constraints: sm80_mma's sets came out 73 of 80 with the direct epilogue where rejection
        gives about half), hence only the fallback. Every check counts as a try, so ``max_tries``
        bounds the work as before."""
        seen = {_key(k) for k in exclude}
        out: list[dict[str, KnobValue]] = []
        movable = tuple(name for name, k in self.knobs.items() if len(k.values) > 1)
        tries = 0
        while tries < max_tries and len(out) < n:
            knobs = self.random(rng)
            tries += 1
            reasons = self.check(knobs, shape, arch)
            for _ in range(REDRAWS if tries > REJECTION_TRIES else 0):
                if not reasons or tries >= max_tries or not movable:
                    break
                names = sorted(self.knobs_behind(reasons) & set(movable))
                name = rng.choice(names or movable)
                trial = dict(knobs)
                trial[name] = rng.choice(self.knobs[name].values)
                tries += 1
                after = self.check(trial, shape, arch)
                if len(after) <= len(reasons):
                    knobs, reasons = trial, after
            if reasons:
                continue
            key = _key(knobs)
            if key in seen:
                continue
            seen.add(key)
            out.append(knobs)
        return out

    def knobs_behind(self, reasons: Sequence[str]) -> set[str]:
        """The knobs named, directly, through derived values or through a string knob's value
        names, by the constraints whose reasons (as :meth:`check` gives them) are ``reasons``."""
        culprits = _culprits(tuple(self.derived.items()), self.constraints,
                             tuple((name, tuple(k.aliases())) for name, k in self.knobs.items()))
        return {k for c in self.constraints
                if any(r == c.reason or r.startswith(c.reason + " (") for r in reasons)
                for k in culprits[c.reason]}

    def size(self) -> int:
        """Number of knob combinations before constraints."""
        total = 1
        for k in self.knobs.values():
            total *= len(k.values)
        return total


@functools.lru_cache(maxsize=256)
def _dependent(derived: tuple[tuple[str, str], ...], roots: frozenset[str]) -> frozenset[str]:
    """Derived names that use one of ``roots``, directly or through earlier derived names."""
    dep: set[str] = set()
    for name, expr in derived:
        if _names(expr) & (roots | dep):
            dep.add(name)
    return frozenset(dep)


#: plain rejection tries of :meth:`KnobSpace.sample` before invalid draws are redrawn
REJECTION_TRIES = 2000
#: knob redraws per invalid draw in :meth:`KnobSpace.sample`, after :data:`REJECTION_TRIES`
REDRAWS = 64


@functools.lru_cache(maxsize=256)
def _culprits(derived: tuple[tuple[str, str], ...], constraints: tuple[Constraint, ...],
              aliases: tuple[tuple[str, tuple[str, ...]], ...]) -> dict[str, tuple[str, ...]]:
    """For each constraint's reason, the knobs its expression names, directly, through derived
    values or through a string knob's value names (``SCHED_pingpong`` is SCHED's)."""
    exprs = dict(derived)
    owner = {alias: name for name, names in aliases for alias in names}
    knobs = {name for name, _ in aliases}
    out: dict[str, tuple[str, ...]] = {}
    for c in constraints:
        found: set[str] = set()
        stack, visited = list(_names(c.expr)), set()
        while stack:
            name = stack.pop()
            if name in visited:
                continue
            visited.add(name)
            if name in knobs:
                found.add(name)
            elif name in exprs:
                stack.extend(_names(exprs[name]))
            elif name in owner:
                found.add(owner[name])
        out[c.reason] = tuple(sorted(found | set(out.get(c.reason, ()))))
    return out


def _key(knobs: Mapping[str, KnobValue]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in knobs.items()))


def knob_key(knobs: Mapping[str, KnobValue]) -> tuple:
    """A hashable identity of a knob set (for de-duplication)."""
    return _key(knobs)
