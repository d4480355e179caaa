"""The static scan's structural pass over the macro-expanded tokens: namespace-scope declarations
(host functions, mutable state), kernel signatures and the launch plan checked against them
(rules in :mod:`._static`'s docstring, sections "State between calls" and "Plan")."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from populations import POINTER_ARGS, Candidate, PlanError, Shape

from ._lex import Token
from ._macros import _match


#: Dynamic shared memory a plan may ask for, per arch (A100: 163 KiB, H100/H200: 227 KiB).
SMEM_LIMITS = {"sm_80": 166912, "sm_90a": 232448}
_KEYWORDS = frozenset({"if", "for", "while", "switch", "return", "sizeof", "catch", "do", "else",
                       "alignof", "decltype", "static_assert", "__launch_bounds__", "__align__",
                       "alignas", "__attribute__", "asm", "__asm__", "volatile", "defined"})
_ATTRS = frozenset({"__align__", "alignas", "__attribute__", "__launch_bounds__", "__declspec",
                    "__maxnreg__", "__cluster_dims__", "__nv_register_params__", "__noinline__"})
_NOT_INT32 = frozenset({"long", "size_t", "int64_t", "uint64_t", "ptrdiff_t", "float", "double", "half",
                        "__half", "short", "char", "bool", "int16_t", "uint16_t", "int8_t", "uint8_t"})
_INT32_TYPES = frozenset({"int", "unsigned", "signed", "int32_t", "uint32_t", "const", "__restrict__",
                          "std", "cuda", "::"})


@dataclass
class _Kernel:
    name: str
    extern_c: bool
    params: list[list[Token]]
    line: int


# -- structure: namespace-scope declarations, kernels, mutable state ---------------------------
def _strip_attrs(decl: list[Token]) -> list[Token]:
    """Drop ``__align__(...)``, ``__launch_bounds__(...)``, ``template<...>`` headers and friends."""
    out: list[Token] = []
    i = 0
    while i < len(decl):
        t = decl[i]
        if t.text in _ATTRS and i + 1 < len(decl) and decl[i + 1].text == "(":
            i = _match(decl, i + 1) + 1
            continue
        if t.text == "template" and i + 1 < len(decl) and decl[i + 1].text == "<":
            depth, j = 0, i + 1
            while j < len(decl):
                depth += {"<": 1, ">": -1, ">>": -2}.get(decl[j].text, 0)
                if depth <= 0:
                    break
                j += 1
            i = j + 1
            continue
        out.append(t)
        i += 1
    return out


def _structure(tokens: list[Token], reasons: list[str], telemetry: dict[str, Any]) -> dict[str, _Kernel]:
    kernels: dict[str, _Kernel] = {}
    device_functions = 0
    # scope stack entries: ("ns", extern_c) | ("class", _) | ("func", _) | ("init", _)
    stack: list[tuple[str, bool]] = [("ns", False)]
    saved: list[list[Token]] = [[]]  # per open scope: a class head, kept for what follows its body
    decl: list[Token] = []
    i = 0
    while i < len(tokens):
        t = tokens[i]
        scope, extern_c = stack[-1]
        if t.kind == "punct" and t.text == "{":
            kind = _brace_kind(decl, scope)
            if kind == "func" and scope == "ns":
                clean = _strip_attrs(decl)
                name, params = _signature(clean)
                quals = {x.text for x in clean}
                if "__global__" in quals:
                    kernels[name] = _Kernel(name, extern_c or _has_extern_c(decl), params, t.line)
                elif "__device__" in quals:
                    device_functions += 1
                else:
                    reasons.append(f"line {t.line}: host function {name or '?'} (namespace-scope functions "
                                   "must be __global__ or __device__)")
            elif kind == "init" and scope != "init":  # a brace initialiser: ``T x = {...}`` or ``T x{...}``
                _check_variable(decl, scope, reasons)
            stack.append((kind, extern_c or (kind == "ns" and _has_extern_c(decl))))
            saved.append(decl + [t] if kind == "class" else [])
            decl = [] if kind != "init" else decl
            i += 1
            continue
        if t.kind == "punct" and t.text == "}":
            if len(stack) > 1:
                closed = stack.pop()[0]
                prefix = saved.pop()
                if closed == "init":
                    decl.append(t)
                    i += 1
                    continue
                if closed == "class":  # ``typedef struct {...} T;`` / ``struct S {...} var;`` go on
                    decl = prefix + [t]
                    i += 1
                    continue
            decl = []
            i += 1
            continue
        if t.kind == "punct" and t.text == ";" and scope != "init":
            if scope in ("ns", "class") and decl:
                _check_ns_declaration(decl, scope, reasons)
            elif scope == "func" and decl:
                _check_variable(decl, scope, reasons)
            decl = []
            i += 1
            continue
        if t.kind == "punct" and t.text == "(" and scope != "init":
            close = _match(tokens, i)  # keep parenthesised groups (incl. lambdas' braces) whole
            decl.extend(tokens[i:close + 1])
            i = close + 1
            continue
        decl.append(t)
        i += 1
    telemetry["device_functions"] = device_functions
    return kernels


def _has_extern_c(decl: list[Token]) -> bool:
    return any(a.text == "extern" and b.kind == "str" and b.text == "C" for a, b in zip(decl, decl[1:]))


def _brace_kind(decl: list[Token], scope: str) -> str:
    if scope in ("func", "init"):
        return "init" if scope == "init" or (decl and any(x.text == "=" for x in decl)) else "func"
    words = [x.text for x in _strip_attrs(decl)]
    if "namespace" in words or (words[:2] == ["extern", "C"] and len(decl) == 2):
        return "ns"
    if decl and decl[-1].kind == "str" and len(decl) >= 2 and decl[-2].text == "extern":
        return "ns"
    if "=" in words:
        return "init"
    if any(w in ("struct", "class", "union", "enum") for w in words) and "(" not in words:
        return "class"
    if "(" in words:
        return "func"
    return "init"


def _signature(decl: list[Token]) -> tuple[str, list[list[Token]]]:
    """Name and parameter token lists of a function definition's declarator."""
    for j, t in enumerate(decl):
        if t.text == "(" and j > 0 and decl[j - 1].kind == "id" and decl[j - 1].text not in _KEYWORDS:
            close = _match(decl, j)
            inner = list(decl[j + 1:close])
            params: list[list[Token]] = []
            cur: list[Token] = []
            depth = 0
            for x in inner:
                if x.text in ("(", "[", "{", "<"):
                    depth += 1
                elif x.text in (")", "]", "}", ">"):
                    depth -= 1
                elif x.text == ">>":
                    depth -= 2
                if x.text == "," and depth == 0:
                    params.append(cur)
                    cur = []
                else:
                    cur.append(x)
            if cur:
                params.append(cur)
            if len(params) == 1 and [x.text for x in params[0]] == ["void"]:
                params = []
            return decl[j - 1].text, params
    return "", []


def _check_ns_declaration(decl: list[Token], scope: str, reasons: list[str]) -> None:
    clean = _strip_attrs(decl)
    cw = [x.text for x in clean]
    if not cw or cw[0] in ("typedef", "using", "static_assert", "friend") or cw[-1] == "}":
        return  # aliases, assertions, and type definitions that declare no variable
    if any(w in ("struct", "class", "union", "enum") for w in cw) and "{" not in cw and "=" not in cw:
        return  # forward declaration
    eq = cw.index("=") if "=" in cw else len(cw)
    if "(" in cw[:eq]:
        return  # a function declaration (prototype); ``__host__`` is refused by the name check
    _check_variable(decl, scope, reasons)


def _check_variable(decl: list[Token], scope: str, reasons: list[str]) -> None:
    words = [x.text for x in _strip_attrs(decl)]
    if not words:
        return
    if scope == "func":
        if "static" not in words and "__device__" not in words and "__managed__" not in words:
            return
        if words[0] == "static_assert":
            return
    if scope == "class" and "static" not in words:
        return
    if words[0] in ("typedef", "using", "static_assert", "return"):
        return
    eq = words.index("=") if "=" in words else len(words)
    head = words[:eq]
    if "__shared__" in head or "__constant__" in head or "constexpr" in head:
        return
    if "extern" in head and "__shared__" not in head:
        reasons.append(f"line {decl[0].line}: extern variable declaration")
        return
    star = max((k for k, w in enumerate(head) if w == "*"), default=-1)
    if "const" in head[star + 1:]:
        return
    name = next((w for w in reversed(head) if re.fullmatch(r"[A-Za-z_]\w*", w) and w not in
                 ("const", "volatile", "static", "__device__", "__restrict__")), "?")
    where = {"ns": "namespace-scope", "class": "static member", "func": "static local"}[scope]
    reasons.append(f"line {decl[0].line}: mutable {where} variable {name} "
                   "(device state that could persist between calls)")


# -- plan --------------------------------------------------------------------------------------
def _param_kind(param: list[Token]) -> str:
    words = [t.text for t in param]
    if "*" in words or "&" in words or "[" in words:
        return "pointer"
    if "__grid_constant__" in words:
        return "grid_constant"
    type_words = [w for w in words[:-1] if w not in ("const", "__restrict__", "volatile")] if len(words) > 1 else words
    if type_words and all(w in _INT32_TYPES for w in type_words):
        return "int"
    if set(words) & _NOT_INT32:
        return "not_int32"
    return "other"  # a typedef or struct the scan cannot size; the GPU worker's checks decide


def _check_plan(candidate: Candidate, kernels: Mapping[str, _Kernel], arch: str | None) -> list[str]:
    plan = candidate.plan
    reasons: list[str] = []
    try:
        plan.validate_static()
    except PlanError as exc:
        return [f"plan: {exc}"]
    for idx, launch in enumerate(plan.launches):
        k = kernels.get(launch.kernel)
        if k is None:
            reasons.append(f"plan launch {idx}: kernel {launch.kernel} is not an extern \"C\" __global__ "
                           "function of the source")
            continue
        if not k.extern_c:
            reasons.append(f"plan launch {idx}: kernel {launch.kernel} is not extern \"C\" (its name is mangled)")
        if len(k.params) != len(launch.args):
            reasons.append(f"plan launch {idx}: kernel {launch.kernel} takes {len(k.params)} parameters, "
                           f"the plan passes {len(launch.args)}")
            continue
        for pos, (arg, param) in enumerate(zip(launch.args, k.params)):
            kind = _param_kind(param)
            want = "pointer" if arg in POINTER_ARGS else \
                "grid_constant" if arg.startswith("tmap:") else "int"
            if kind != want and not (want == "int" and kind == "other"):
                text = " ".join(t.text for t in param)
                need = {"pointer": "a pointer", "grid_constant": "a by-value const __grid_constant__ tensor map",
                        "int": "a 32-bit integer"}[want]
                reasons.append(f"plan launch {idx}: argument {pos} ({arg}) of {launch.kernel} needs {need} "
                               f"parameter, the kernel has `{text}`")
    shapes: Iterable[Shape] = candidate.shapes + (smoke_shapes(candidate) if candidate.generic else ())
    max_smem = SMEM_LIMITS.get(arch or "", SMEM_LIMITS["sm_90a"])
    for shape in shapes:
        try:
            plan.resolve(shape, max_smem=max_smem)
        except PlanError as exc:
            reasons.append(f"plan at {shape}: {exc}")
    return reasons


def smoke_shapes(candidate: Candidate) -> tuple[Shape, ...]:
    """Small ragged instances a generic candidate must also handle (same layout and contract)."""
    base = candidate.shapes[0]
    return (base.with_dims(1, 1, 1), base.with_dims(67, 129, 73))
