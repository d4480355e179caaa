"""Seed templates: a CUDA source plus a knob space and a launch plan, all loaded from data
(``_template_load.py`` reads and validates the files; this module is what a template does).

Each folder under ``populations/templates/`` holds ``template.toml`` and the CUDA file it names
(docs/contracts.md §2 is the format). Rendering a knob set prepends ``#define`` lines (knobs,
knob-only derived values, the layout, and M/N/K when specialised) to the source and substitutes
the knob values into the plan, giving a :class:`~populations.Candidate` for one shape.

Optional keys beyond §2: ``applies = "M <= 128 or N <= 128"``, an expression of M, N, K (and
``LAYOUT_TN``/``LAYOUT_NN``) that says for which shapes a template is meant at all (the tiny
latency family uses it); ``lead = "M <= 16"``, an expression of the same names that says where
the family's first picks are seeded before every other family's (the decode families); ``trail =
"M > 16"``, where they come after every other family's first two on a target with an arch-native
family (sm80_mma beside sm90_wgmma); and in a ``[[heuristic]]`` rule, ``derive = { SPLIT_K = "expr" }``:
integer knobs computed from the shape and the rule's other knobs (``expr`` may use every name
of the knob space), snapped down to the largest value of the knob's domain that is <= the
result (the smallest value when none is), e.g. a split-K factor that fills the SMs; and
``prelude = ["mma_sync.cuh"]``: files of ``templates/_prelude/`` whose text the renderer puts
between the ``#define`` header and the source (code several families share; a candidate may
not ``#include`` our own headers, so it travels as text); ``fit = { STAGE = "expr" }``: knobs
set from the shape for every first pick (every heuristic rule's and the defaults), after the
rule's own knobs, so that one rule over shape features (e.g. which operands a ragged K forces
into staging) serves every tile rule; a string knob's expression gives its value's index; and in
``[plan]``, ``staging = { A = "expr", B = "expr" }``: the pitch multiple of each operand's staged
copy (0: not staged), knob-level expressions (populations/_plan.py says what staging is); a
staged operand's tensor maps then read the copy.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from ._expr import ExprError, evaluate, inline, substitute
from ._knobs import (LITERALS, Knob, KnobSpace, KnobValue, TemplateError,
                     knob_key, layout_env)
from ._plan import POINTER_ARGS, Launch, LaunchPlan, PlanError, TensorMapSpec, pitch_env
from ._records import Candidate
from ._shape import Shape

__all__ = ["Template", "TEMPLATES_DIR", "parse_arch"]

TEMPLATES_DIR = Path(__file__).parent / "templates"
_POINTERS = set(POINTER_ARGS)
PRELUDE_DIR = "_prelude"  # under the templates' root; load_templates skips folders starting with "_"


def _shape_env(shape: Shape) -> dict[str, int]:
    return {**LITERALS, **shape.env(), **layout_env(shape.layout)}


def _cc(arch: Union[int, str, None]) -> Optional[int]:
    return None if arch is None else parse_arch(arch)[0]


def _snap(knob: Knob, value: int) -> KnobValue:
    """The largest value of ``knob``'s (int) domain that is <= ``value``; its smallest if none is."""
    below = [v for v in knob.values if v <= value]
    return max(below) if below else min(knob.values)


def parse_arch(arch: Union[int, str]) -> tuple[int, bool]:
    """``80``, ``"sm_80"``, ``"90"``, ``"sm_90a"`` -> (compute capability as int, arch-specific 'a')."""
    if isinstance(arch, int) and not isinstance(arch, bool):
        return arch, False
    text = str(arch).strip().lower().removeprefix("sm_").removeprefix("compute_")
    special = text.endswith("a")
    try:
        return int(text.rstrip("a")), special
    except ValueError:
        raise TemplateError(f"cannot parse architecture {arch!r}; use e.g. 80, 'sm_80' or 'sm_90a'") from None


@dataclass(frozen=True)
class Template:
    """One seed template (see the module docstring)."""

    name: str
    family: str
    description: str
    min_arch: int
    arch_features: tuple[str, ...]
    layouts: tuple[str, ...]
    contracts: tuple[str, ...]
    source_name: str
    source_text: str
    space: KnobSpace
    heuristics: tuple[tuple[str, Mapping[str, KnobValue], Mapping[str, str]], ...]
    plan_spec: Mapping[str, Any]
    applies: str = "true"
    path: Optional[Path] = None
    prelude_text: str = ""
    target_arch: Optional[int] = None  # the arch check/heuristic/sample assume when not given one
    #: False when a knob set is memory-safe only at shapes its constraints allow (a buffer sized by a
    #: knob that must hold a shape-dependent extent): a generic candidate claims every M, N, K and is
    #: checked at ragged ones, so such a template's candidates are always specialised to their shape.
    generic: bool = True
    #: knob -> expression of the shape and the other knobs, applied to every first pick (module docstring)
    fit: Mapping[str, str] = None  # type: ignore[assignment]
    #: shapes (an expression of M, N, K) where this family's first picks go before every other
    #: family's when a population is seeded: the decode families on decode rows
    lead: str = "false"
    #: shapes where this family's first picks go after every other family's first two, on a target
    #: where a family built for its own features (wgmma and TMA on sm_90a) applies: the portable
    #: mma.sync GEMMs beside the Hopper ones (see evo/search/_seeding.py)
    trail: str = "false"

    def for_arch(self, arch: Union[int, str, None]) -> "Template":
        """This template with ``arch`` as the default target of :meth:`check`, :meth:`heuristic`,
        :meth:`sample` and :meth:`render`, so code that does not pass an arch (operators) still
        obeys ``ARCH`` constraints."""
        return replace(self, target_arch=_cc(arch))

    # -- applicability ---------------------------------------------------------------------
    def supports_arch(self, arch: Union[int, str]) -> bool:
        cc, _ = parse_arch(arch)
        if cc < self.min_arch:
            return False
        if "sm_90a" in self.arch_features and cc != 90:
            return False  # arch-specific features exist on exactly compute capability 9.0
        return True

    def applicable(self, shape: Shape, arch: Union[int, str] = 90) -> bool:
        """True when this template is meant for ``shape`` on ``arch`` (layout, contract, arch, ``applies``)."""
        return self.why_not(shape, arch) is None

    def leads(self, shape: Shape) -> bool:
        """True when this family's first picks go before the others' at ``shape`` (its ``lead`` rule)."""
        return bool(evaluate(self.lead, _shape_env(shape)))

    def trails(self, shape: Shape) -> bool:
        """True when this family's first picks go after the others' first two at ``shape`` (its
        ``trail`` rule; the seeding applies it only where an arch-native family applies too)."""
        return bool(evaluate(self.trail, _shape_env(shape)))

    def why_not(self, shape: Shape, arch: Union[int, str] = 90) -> Optional[str]:
        """Why this template is not meant for ``shape`` on ``arch``, in a few words; None when it is."""
        if shape.layout not in self.layouts:
            return f"layout {shape.layout} (it has {'/'.join(self.layouts)})"
        if shape.contract not in self.contracts:
            return f"contract {shape.contract} (it has {'/'.join(self.contracts)})"
        if not self.supports_arch(arch):
            return f"arch {arch} (it needs sm_{self.min_arch}+" + (f" with {'/'.join(self.arch_features)})"
                                                                   if self.arch_features else ")")
        if not evaluate(self.applies, _shape_env(shape)):
            return f"its applies rule ({self.applies}) is false at M={shape.m} N={shape.n} K={shape.k}"
        return None

    def compile_arch(self, arch: Union[int, str]) -> str:
        """The NVRTC/nvcc target for this template on ``arch`` (``sm_90a`` when it needs arch features)."""
        cc, _ = parse_arch(arch)
        return f"sm_{cc}a" if "sm_90a" in self.arch_features else f"sm_{cc}"

    # -- knob sets -------------------------------------------------------------------------
    def check(self, knobs: Mapping[str, KnobValue], shape: Optional[Shape] = None,
              arch: Union[int, str, None] = None) -> list[str]:
        """Reasons ``knobs`` (missing ones at their defaults) is invalid; empty when valid.

        Constraints that need the shape (M, N, K, the layout) or the arch (``ARCH``) are checked
        only when that is given.
        """
        reasons = self.space.check(self.space.complete(knobs), shape, _cc(arch) if arch is not None else self.target_arch)
        if shape is not None and not reasons:
            if shape.layout not in self.layouts:
                reasons.append(f"layout {shape.layout} is not one of {list(self.layouts)}")
            if shape.contract not in self.contracts:
                reasons.append(f"contract {shape.contract} is not one of {list(self.contracts)}")
        return reasons

    def heuristic(self, shape: Shape, arch: Union[int, str, None] = None) -> list[dict[str, KnobValue]]:
        """The valid knob sets of every ``[[heuristic]]`` rule whose ``when`` holds, first rules first.

        A rule's ``derive`` knobs are computed for ``shape`` (see the module docstring). Falls
        back to the defaults (when valid) so a shape always gets a first pick if one exists.
        """
        out: list[dict[str, KnobValue]] = []
        seen: set = set()
        senv = _shape_env(shape)
        picks = [self._derive(self.space.complete(k), derive, shape)
                 for when, k, derive in self.heuristics if evaluate(when, senv)]
        picks.append(self.space.defaults())
        picks = [self.fitted(k, shape) if k is not None else None for k in picks]
        for knobs in picks:
            if knobs is None:
                continue
            key = knob_key(knobs)
            if key in seen or self.check(knobs, shape, arch):
                continue
            seen.add(key)
            out.append(knobs)
        return out

    def fitted(self, knobs: Mapping[str, KnobValue], shape: Shape) -> Optional[dict[str, KnobValue]]:
        """``knobs`` (completed) with the template's ``fit`` knobs set for ``shape`` (None if an
        expression cannot be evaluated); unchanged for a template without ``fit``. Transfer uses it
        too: a knob set moved to a ragged shape gets the staging that shape needs."""
        return self._derive(self.space.complete(knobs), self.fit or {}, shape)

    def _derive(self, knobs: dict[str, KnobValue], derive: Mapping[str, str],
                shape: Shape) -> Optional[dict[str, KnobValue]]:
        """``knobs`` with each of ``derive``'s knobs computed for ``shape`` (a rule's ``derive``, or
        ``fit``): an int snapped to its domain, a bool by truth, a string by its value's index; None
        if an expression cannot be evaluated or names no value."""
        if not derive:
            return knobs
        try:
            env = self.space.env(knobs, shape)
            for name, expr in derive.items():
                knob, value = self.space.knobs[name], evaluate(expr, env)
                if knob.kind == "str":
                    if not 0 <= value < len(knob.values):
                        return None
                    knobs[name] = knob.values[value]
                elif knob.kind == "bool":
                    knobs[name] = bool(value)
                else:
                    knobs[name] = _snap(knob, value)
                env = self.space.env(knobs, shape)
        except ExprError:
            return None
        return knobs

    def sample(self, rng: Union[random.Random, int], shape: Optional[Shape], n: int,
               arch: Union[int, str, None] = None) -> list[dict[str, KnobValue]]:
        """Up to ``n`` distinct valid knob sets drawn at random (fewer when the space is small)."""
        if not isinstance(rng, random.Random):
            rng = random.Random(rng)
        return self.space.sample(rng, shape, n, arch=_cc(arch) if arch is not None else self.target_arch)

    # -- rendering -------------------------------------------------------------------------
    def render(self, knobs: Mapping[str, KnobValue], shape: Shape, specialize: bool = False) -> tuple[str, LaunchPlan]:
        """(source, plan) for ``knobs`` at ``shape``; raises :class:`TemplateError` with the reasons when
        invalid. Always specialised when the template is not ``generic``."""
        specialize = specialize or not self.generic
        full = self.space.complete(knobs)
        reasons = self.check(full, shape)
        if reasons:
            raise TemplateError(f"template {self.name}: invalid knobs for {shape}: " + "; ".join(reasons))
        env = self.space.env(full, None, layout=shape.layout)  # knob- and layout-level bindings
        header = [f"// evo template {self.name} (family {self.family}); generated, do not edit",
                  f"#define EVO_LAYOUT_{shape.layout} 1"]
        for name, knob in self.space.knobs.items():
            if knob.kind == "str":
                header += [f"#define {alias} {value}" for alias, value in knob.aliases().items()]
            header.append(f"#define {name} {knob.as_int(full[name])}")
        dependent = self.space.shape_dependent()
        for name in self.space.derived:
            if name not in dependent and name in env:
                header.append(f"#define {name} {env[name]}")
        if specialize:
            header += [f"#define EVO_M {shape.m}", f"#define EVO_N {shape.n}", f"#define EVO_K {shape.k}"]
        source = "\n".join(header) + "\n" + self.prelude_text + f'#line 1 "{self.source_name}"\n' + self.source_text
        return source, self._plan(env, shape, specialize)

    def candidate(self, knobs: Mapping[str, KnobValue], shape: Shape, specialize: bool = False,
                  **provenance: Any) -> Candidate:
        """A :class:`Candidate` for ``knobs`` at ``shape`` (``template`` and ``knobs`` set; generic unless
        specialised, and always specialised when the template is not ``generic``)."""
        specialize = specialize or not self.generic
        source, plan = self.render(knobs, shape, specialize)
        provenance.setdefault("operator", "seed")
        return Candidate(source=source, plan=plan, shapes=(shape,), generic=not specialize,
                         template=self.name, knobs=self.space.complete(knobs), **provenance)

    def _plan(self, env: dict[str, int], shape: Shape, specialize: bool) -> LaunchPlan:
        spec = self.plan_spec
        try:
            staging = {op: int(evaluate(text, env)) for op, text in (spec.get("staging") or {}).items()}
        except ExprError as exc:
            raise TemplateError(f"template {self.name}: staging does not render for {shape}: {exc}") from None
        staging = {op: p for op, p in staging.items() if p}
        bind = dict(env)
        if specialize:
            bind.update(shape.env())
            bind.update(pitch_env(shape, staging))
        shape_derived = {n: self.space.derived[n] for n in self.space.shape_dependent()}

        def expr(text: Any) -> Any:
            if isinstance(text, str):
                text = inline(text, shape_derived)
            return substitute(text, bind)

        launches = []
        try:
            for lt in spec["launches"]:
                if not evaluate(lt.get("when", "true"), env):
                    continue
                block = tuple(evaluate(b, env) for b in lt["block"])
                args = tuple(a if a in _POINTERS or a.startswith("tmap:") else str(expr(a)) for a in lt["args"])
                launches.append(Launch(kernel=lt["kernel"], grid=tuple(expr(g) for g in lt["grid"]),
                                       block=block, smem=expr(lt.get("smem", 0)), args=args))
            tmaps = {name: TensorMapSpec(matrix=t["matrix"], box=tuple(evaluate(b, env) for b in t["box"]),
                                         swizzle=int(t.get("swizzle", 128)), staged=staging.get(t["matrix"], 0))
                     for name, t in (spec.get("tensor_maps") or {}).items() if evaluate(t.get("when", "true"), env)}
            return LaunchPlan(launches=tuple(launches), workspace=expr(spec.get("workspace", 0)),
                              zero_workspace=bool(spec.get("zero_workspace", False)), tensor_maps=tmaps,
                              coresident=bool(spec.get("coresident", False)), staging=staging)
        except (ExprError, PlanError) as exc:
            raise TemplateError(f"template {self.name}: plan does not render for {shape}: {exc}") from None

