"""Loading seed templates: ``template.toml`` read, every part validated (docs/contracts.md §2),
and a :class:`~populations._template.Template` built from it; :func:`load_templates` loads every
folder under ``populations/templates/``. Kept apart from the class so that what a template *is*
(rendering, heuristics, sampling) reads without the validation of what a file may say."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Union

from ._expr import ExprError, check_expr, inline
from ._knobs import LAYOUT_NAMES, LITERALS, SHAPE_NAMES, Constraint, Knob, KnobSpace, TemplateError
from ._plan import STAGEABLE, PlanError
from ._shape import CONTRACTS, LAYOUTS
from ._staging import with_staging
from ._template import _POINTERS, PRELUDE_DIR, TEMPLATES_DIR, Template

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["load_template", "load_templates"]

FAMILIES = ("A", "B", "T")
_TOP_KEYS = {"name", "family", "description", "min_arch", "arch_features", "layouts", "contracts",
             "source", "knobs", "derived", "constraints", "heuristic", "plan", "applies", "prelude", "generic",
             "fit", "stageable", "stage_bypass", "heuristic_exprs", "lead", "trail"}
_REQUIRED = {"name", "family", "min_arch", "layouts", "contracts", "source", "knobs", "plan"}
_KNOB_KEYS = {"values", "default", "axis", "doc"}
_PLAN_KEYS = {"workspace", "zero_workspace", "launches", "tensor_maps", "coresident", "staging"}
_LAUNCH_KEYS = {"kernel", "grid", "block", "smem", "args", "when"}
_TMAP_KEYS = {"matrix", "box", "swizzle", "when"}
_LD_NAMES = {"lda", "ldb", "ldc", "ldsa", "ldsb"}
_FEATURES = {"sm_90a"}
_SHAPE_ONLY = SHAPE_NAMES | LAYOUT_NAMES | set(LITERALS)
_RULE_KEYS = {"when", "knobs", "derive"}


def load_template(folder: Union[str, Path]) -> Template:
    """Load and validate one template folder; every problem raises :class:`TemplateError` naming the file."""
    folder = Path(folder)
    path = folder / "template.toml"
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise TemplateError(f"{path}: missing (every folder under {folder.parent} must hold a template.toml)") from None
    except tomllib.TOMLDecodeError as exc:
        raise TemplateError(f"{path}: not valid TOML: {exc}") from None
    try:
        return _build(folder, data)
    except TemplateError as exc:
        raise TemplateError(f"{path}: {exc}") from None
    except (ExprError, PlanError, KeyError, TypeError, ValueError) as exc:
        raise TemplateError(f"{path}: {type(exc).__name__}: {exc}") from None


def _unknown(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    extra = set(table) - allowed
    if extra:
        raise TemplateError(f"unknown key(s) {sorted(extra)} in {where}; allowed: {sorted(allowed)}")


def _build(folder: Path, data: Mapping[str, Any]) -> Template:
    """A template from its folder and parsed ``template.toml``, every part checked (one
    TemplateError naming the first problem)."""
    _unknown(data, _TOP_KEYS, "the top level")
    stageable = data.get("stageable", False)
    if not isinstance(stageable, bool):
        raise TemplateError(f"stageable must be true or false, got {stageable!r}")
    if stageable:  # the alignment transform (populations/_staging.py)
        data = with_staging(data)
    elif "stage_bypass" in data:
        raise TemplateError("stage_bypass names knob sets that need no alignment transform: only with stageable = true")
    missing = _REQUIRED - set(data)
    if missing:
        raise TemplateError(f"missing required key(s) {sorted(missing)}")
    name = data["name"]
    if name != folder.name:
        raise TemplateError(f"name {name!r} must equal the folder name {folder.name!r}")
    layouts, contracts, features = _targets(data)
    src = folder / data["source"]
    if not src.is_file():
        raise TemplateError(f"source {data['source']!r} does not exist in {folder}")
    prelude = _prelude(folder, data)
    space = _knob_space(data)
    applies = data.get("applies", "true")
    check_expr(applies, _SHAPE_ONLY)
    lead = data.get("lead", "false")
    check_expr(lead, _SHAPE_ONLY)
    trail = data.get("trail", "false")
    check_expr(trail, _SHAPE_ONLY)
    heuristics = _heuristics(data, space)
    plan = data["plan"]
    _check_plan(plan, space)
    generic = data.get("generic", True)
    if not isinstance(generic, bool):
        raise TemplateError(f"generic must be true or false, got {generic!r}")
    fit = dict(data.get("fit", {}))
    for k, expr in fit.items():
        if k not in space.knobs:
            raise TemplateError(f"fit: {k!r} is not a knob")
        check_expr(str(expr), space.names)
    return Template(
        name=name, family=data["family"], description=data.get("description", ""), min_arch=data["min_arch"],
        arch_features=features, layouts=layouts, contracts=contracts, source_name=data["source"],
        source_text=src.read_text(), space=space, heuristics=heuristics, plan_spec=plan,
        applies=applies, path=folder, prelude_text=prelude, generic=generic, fit=fit, lead=lead,
        trail=trail,
    )


def _targets(data: Mapping[str, Any]) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """(layouts, contracts, arch features) the template declares, checked with its family and
    minimum architecture."""
    if data["family"] not in FAMILIES:
        raise TemplateError(f"family {data['family']!r} is not one of {FAMILIES}")
    layouts, contracts = tuple(data["layouts"]), tuple(data["contracts"])
    if not layouts or not set(layouts) <= set(LAYOUTS):
        raise TemplateError(f"layouts {list(layouts)} must be a non-empty subset of {list(LAYOUTS)}")
    if not contracts or not set(contracts) <= set(CONTRACTS):
        raise TemplateError(f"contracts {list(contracts)} must be a non-empty subset of {list(CONTRACTS)}")
    features = tuple(data.get("arch_features", ()))
    if not set(features) <= _FEATURES:
        raise TemplateError(f"arch_features {list(features)} must be a subset of {sorted(_FEATURES)}")
    if not isinstance(data["min_arch"], int) or data["min_arch"] < 70:
        raise TemplateError(f"min_arch must be an integer compute capability such as 80, got {data['min_arch']!r}")
    return layouts, contracts, features


def _prelude(folder: Path, data: Mapping[str, Any]) -> str:
    """The shared prelude files the template names, concatenated with ``#line`` markers."""
    prelude = ""
    for pname in data.get("prelude", ()):
        ppath = folder.parent / PRELUDE_DIR / str(pname)
        if "/" in str(pname) or not ppath.is_file():
            raise TemplateError(f"prelude {pname!r} is not a file of {folder.parent / PRELUDE_DIR}")
        prelude += f'#line 1 "{PRELUDE_DIR}/{pname}"\n' + ppath.read_text().rstrip("\n") + "\n"
    return prelude


def _knob_space(data: Mapping[str, Any]) -> KnobSpace:
    """The knobs, derived values and constraints of ``[knobs]``, ``[derived]``, ``[[constraints]]``."""
    knobs: dict[str, Knob] = {}
    for kname, table in data["knobs"].items():
        _unknown(table, _KNOB_KEYS, f"[knobs.{kname}]")
        if "values" not in table or "default" not in table:
            raise TemplateError(f"[knobs.{kname}] needs values and default")
        knobs[kname] = Knob(kname, tuple(table["values"]), table["default"], table.get("axis", "other"), table.get("doc", ""))
    constraints = []
    for c in data.get("constraints", ()):
        _unknown(c, {"expr", "reason"}, "[[constraints]]")
        constraints.append(Constraint(c["expr"], c.get("reason", "")))
    return KnobSpace(knobs, dict(data.get("derived", {})), tuple(constraints))


def _heuristic_exprs(data: Mapping[str, Any], space: KnobSpace) -> dict[str, str]:
    """``[heuristic_exprs]``: names for expressions that several first-pick rules share (the
    deepest ring that fits, which tile width fills the last wave better), each usable in a
    rule's ``derive``, in its ``when`` where it stands for shape-only terms, and in the names
    after it. Inlined into the rules when the template loads,
    so a rule evaluates exactly the expression it would spell out; never part of the knob
    space, the source or a plan."""
    table = data.get("heuristic_exprs", {})
    if not isinstance(table, Mapping):
        raise TemplateError("[heuristic_exprs] must be a table of NAME = \"expression\"")
    named: dict[str, str] = {}
    for name, expr in table.items():
        if not name.isidentifier() or name != name.upper() or name in space.names or name in LITERALS:
            raise TemplateError(f"[heuristic_exprs] {name!r}: not an upper-case name, or one the knob space already uses")
        if not isinstance(expr, str):
            raise TemplateError(f"[heuristic_exprs] {name}: the expression must be a string, got {expr!r}")
        try:
            check_expr(expr, space.names | set(named))  # names defined above it only: no cycles
        except ExprError as exc:
            raise TemplateError(f"[heuristic_exprs] {name}: {exc}") from None
        named[name] = inline(expr, named)
    return named


def _heuristics(data: Mapping[str, Any], space: KnobSpace) -> tuple[tuple[str, dict, dict], ...]:
    """The ``[[heuristic]]`` rules as (when, knob picks, derived knobs), each checked against the
    space; the names of ``[heuristic_exprs]`` inlined into the conditions and the derived knobs
    (a condition must come out of it with shape names only)."""
    knobs = space.knobs
    named = _heuristic_exprs(data, space)
    heuristics = []
    for rule in data.get("heuristic", ()):
        _unknown(rule, _RULE_KEYS, "[[heuristic]]")
        when = rule.get("when", "true")
        check_expr(when, _SHAPE_ONLY | set(named))
        when = inline(when, named)
        check_expr(when, _SHAPE_ONLY)   # a name standing for knob-level terms is refused here
        picks = dict(rule.get("knobs", {}))
        bad = [f"{k}={v!r}" for k, v in picks.items() if k not in knobs or v not in knobs[k].values]
        if bad:
            raise TemplateError(f"[[heuristic]] when={when!r}: unknown knob or value outside its domain: {', '.join(bad)}")
        derive = {}
        for k, expr in dict(rule.get("derive", {})).items():
            if k not in knobs or knobs[k].kind != "int" or k in picks:
                raise TemplateError(f"[[heuristic]] when={when!r}: derive {k!r} must be an int knob not also in knobs")
            check_expr(str(expr), space.names | set(named))
            derive[k] = inline(str(expr), named)
        heuristics.append((when, picks, derive))
    return tuple(heuristics)


def _check_plan(plan: Mapping[str, Any], space: KnobSpace) -> None:
    """``[plan]``: workspace, tensor maps and launches use only the names they may (a block
    size only knobs, a grid also the shape and leading dimensions)."""
    knob_level = space.names - SHAPE_NAMES - space.shape_dependent()
    _unknown(plan, _PLAN_KEYS, "[plan]")
    plan_names = space.names | _LD_NAMES
    check_expr(str(plan.get("workspace", 0)), plan_names)
    if not plan.get("launches"):
        raise TemplateError("[plan] needs at least one [[plan.launches]]")
    staging = plan.get("staging") or {}
    for op, text in staging.items():
        if op not in STAGEABLE:
            raise TemplateError(f"[plan.staging]: {op!r} cannot be staged (only {list(STAGEABLE)})")
        check_expr(str(text), knob_level)
    tmaps = plan.get("tensor_maps") or {}
    for tname, t in tmaps.items():
        _unknown(t, _TMAP_KEYS, f"[plan.tensor_maps.{tname}]")
        for b in t["box"]:
            check_expr(str(b), knob_level)
        check_expr(str(t.get("when", "true")), knob_level)
    for lt in plan["launches"]:
        _unknown(lt, _LAUNCH_KEYS, "[[plan.launches]]")
        check_expr(str(lt.get("when", "true")), knob_level)
        if len(lt["block"]) != 3 or len(lt["grid"]) != 3:
            raise TemplateError(f"launch {lt['kernel']}: grid and block need three entries")
        for b in lt["block"]:
            try:
                check_expr(str(b), knob_level)
            except ExprError as exc:
                raise TemplateError(f"launch {lt['kernel']}: block must be knob-only: {exc}") from None
        for g in list(lt["grid"]) + [lt.get("smem", 0)]:
            check_expr(str(g), plan_names)
        for a in lt["args"]:
            if a in _POINTERS:
                continue
            if a.startswith("tmap:"):
                if a[5:] not in tmaps:
                    raise TemplateError(f"launch {lt['kernel']}: unknown tensor map {a!r}")
                continue
            check_expr(a, plan_names)


def load_templates(root: Union[str, Path, None] = None, *, errors: str = "raise") -> dict[str, Template]:
    """Every template folder under ``root`` (default: ``populations/templates``), by name.

    Folders starting with ``_`` or ``.`` are ignored. A broken folder raises
    :class:`TemplateError` naming its file (``errors="raise"``), or is skipped with a warning
    on stderr (``errors="warn"``), so one half-written template cannot hide the others.
    """
    if errors not in ("raise", "warn"):
        raise ValueError("errors must be 'raise' or 'warn'")
    root = Path(root) if root is not None else TEMPLATES_DIR
    out: dict[str, Template] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))):
        try:
            t = load_template(folder)
        except TemplateError as exc:
            if errors == "raise":
                raise
            print(f"warning: skipping template {folder.name}: {exc}", file=sys.stderr)
            continue
        out[t.name] = t
    return out
