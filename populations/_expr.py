"""A tiny, safe integer expression language.

Launch plans and knob constraints are data, not code: a grid may be ``cdiv(N, BN)``, a
constraint ``BM % WM == 0 and SMEM <= 232448``. We parse them with :mod:`ast` and accept
only integer arithmetic, comparisons, boolean logic, a conditional and a few functions,
so a plan from an untrusted operator (an LLM) can never run code in the harness.
"""
from __future__ import annotations

import ast
import functools
from typing import Mapping, Union

Number = Union[int, bool]

__all__ = ["ExprError", "evaluate", "names_in", "check_expr", "substitute", "inline"]


class ExprError(ValueError):
    """An expression is malformed, uses something outside the language, or fails to evaluate."""


def _cdiv(a: int, b: int) -> int:
    if b == 0:
        raise ExprError("cdiv by zero")
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


_FUNCS = {"cdiv": _cdiv, "min": min, "max": max, "round_up": _round_up}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
    ast.BitAnd: lambda a, b: a & b,
    ast.BitOr: lambda a, b: a | b,
    ast.LShift: lambda a, b: a << b,
    ast.RShift: lambda a, b: a >> b,
}
_CMPOPS = {
    ast.Eq: lambda a, b: a == b,
    ast.NotEq: lambda a, b: a != b,
    ast.Lt: lambda a, b: a < b,
    ast.LtE: lambda a, b: a <= b,
    ast.Gt: lambda a, b: a > b,
    ast.GtE: lambda a, b: a >= b,
}
_MAX_LEN = 1000
_MAX_MAGNITUDE = 1 << 62
#: Deepest nesting an expression may have (ours nest 5 deep): evaluation and ``ast.unparse`` recurse
#: once per level, so ``-(-(-...))`` 999 deep raised RecursionError out of a compile.
_MAX_DEPTH = 48


@functools.lru_cache(maxsize=4096)
def _parse(text: str) -> ast.expr:
    if not isinstance(text, str):
        raise ExprError(f"expression must be a string, got {type(text).__name__}")
    if len(text) > _MAX_LEN:
        raise ExprError(f"expression longer than {_MAX_LEN} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ExprError(f"cannot parse expression {text!r}: {exc.msg}") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # the parser's own limits
        raise ExprError(f"cannot parse expression {text[:60]!r}...: {type(exc).__name__}") from None
    _check_depth(tree.body, text)
    _validate(tree.body, text)
    return tree.body


def _check_depth(root: ast.AST, text: str) -> None:
    """Refuse trees nested deeper than ``_MAX_DEPTH`` (iteratively: no recursion on untrusted input)."""
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise ExprError(f"expression nested deeper than {_MAX_DEPTH} levels: {text[:60]!r}...")
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _validate(node: ast.AST, text: str) -> None:
    ok = (
        ast.Constant, ast.Name, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.IfExp,
        ast.Call, ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.boolop,
    )
    for sub in ast.walk(node):
        if not isinstance(sub, ok):
            raise ExprError(f"{type(sub).__name__} is not allowed in expression {text!r}")
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, (int, bool)):
            raise ExprError(f"only integer constants are allowed in {text!r}")
        if isinstance(sub, ast.BinOp) and type(sub.op) not in _BINOPS:
            raise ExprError(f"operator {type(sub.op).__name__} is not allowed in {text!r}")
        if isinstance(sub, ast.UnaryOp) and not isinstance(sub.op, (ast.USub, ast.UAdd, ast.Not)):
            raise ExprError(f"operator {type(sub.op).__name__} is not allowed in {text!r}")
        if isinstance(sub, ast.Compare) and any(type(o) not in _CMPOPS for o in sub.ops):
            raise ExprError(f"comparison not allowed in {text!r}")
        if isinstance(sub, ast.Call):
            if not isinstance(sub.func, ast.Name) or sub.func.id not in _FUNCS or sub.keywords:
                raise ExprError(f"only {sorted(_FUNCS)} may be called in {text!r}")


@functools.lru_cache(maxsize=4096)  # plans repeat their expressions: decoding 50k candidates walked each AST 50k times
def names_in(text: str) -> frozenset[str]:
    """The free names an expression uses (function names excluded)."""
    tree = _parse(text)
    funcs = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)}  # type: ignore[union-attr]
    return frozenset(n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in funcs)


def check_expr(text: str, allowed: frozenset[str] | set[str]) -> None:
    """Raise :class:`ExprError` unless ``text`` parses and uses only ``allowed`` names."""
    extra = names_in(text) - set(allowed)
    if extra:
        raise ExprError(f"unknown name(s) {sorted(extra)} in {text!r}; allowed: {sorted(allowed)}")


def evaluate(text: str | int, env: Mapping[str, Number]) -> int:
    """Evaluate ``text`` with the integer bindings of ``env``. Plain ints pass through."""
    if isinstance(text, bool):
        return int(text)
    if isinstance(text, int):
        return text
    return int(_eval(_parse(text), env, text))


def _eval(node: ast.AST, env: Mapping[str, Number], text: str) -> Number:
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in env:
            raise ExprError(f"unknown name {node.id!r} in {text!r}")
        value = env[node.id]
        if not isinstance(value, (int, bool)):
            raise ExprError(f"name {node.id!r} is bound to a non-integer in {text!r}")
        return value
    if isinstance(node, ast.BinOp):
        a, b = _eval(node.left, env, text), _eval(node.right, env, text)
        if isinstance(node.op, (ast.FloorDiv, ast.Mod)) and b == 0:
            raise ExprError(f"division by zero in {text!r}")
        if isinstance(node.op, ast.Pow) and (b < 0 or b > 64):
            raise ExprError(f"exponent out of range in {text!r}")
        if isinstance(node.op, ast.LShift) and not 0 <= b <= 62:
            raise ExprError(f"shift out of range in {text!r}")
        out = _BINOPS[type(node.op)](a, b)
        if abs(out) > _MAX_MAGNITUDE:
            raise ExprError(f"value overflows in {text!r}")
        return out
    if isinstance(node, ast.UnaryOp):
        v = _eval(node.operand, env, text)
        if isinstance(node.op, ast.Not):
            return not v
        return -v if isinstance(node.op, ast.USub) else +v
    if isinstance(node, ast.Compare):
        left = _eval(node.left, env, text)
        for op, comp in zip(node.ops, node.comparators):
            right = _eval(comp, env, text)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if isinstance(node, ast.BoolOp):  # Python semantics: the deciding operand's value, not a bool
        value: Number = False
        for v in node.values:
            value = _eval(v, env, text)
            if bool(value) != isinstance(node.op, ast.And):
                return value
        return value
    if isinstance(node, ast.IfExp):
        return _eval(node.body if _eval(node.test, env, text) else node.orelse, env, text)
    if isinstance(node, ast.Call):
        args = [_eval(a, env, text) for a in node.args]
        try:
            return _FUNCS[node.func.id](*args)  # type: ignore[union-attr]
        except TypeError as exc:
            raise ExprError(f"bad call in {text!r}: {exc}") from None
    raise ExprError(f"cannot evaluate {text!r}")  # pragma: no cover - _validate forbids it


def substitute(text: str | int, env: Mapping[str, Number]) -> str | int:
    """Bind the names of ``env`` in ``text`` and fold constants.

    Returns an ``int`` when no free name remains, else a simplified expression string that
    still uses only the remaining names (``"cdiv(N, BN)"`` with ``BN=128`` gives
    ``"cdiv(N, 128)"``). Templates use this to turn knob-level plans into shape-level plans.
    """
    if isinstance(text, (int, bool)):
        return int(text)
    tree = _parse(text)
    if not (names_in(text) - set(env)):
        return evaluate(text, env)

    class _Bind(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id in env:
                return ast.copy_location(ast.Constant(int(env[node.id])), node)
            return node

    bound = ast.fix_missing_locations(_Bind().visit(ast.parse(ast.unparse(tree), mode="eval")))
    return ast.unparse(bound.body)


def inline(text: str, names: Mapping[str, str]) -> str:
    """``text`` with every name of ``names`` replaced by its expression, parenthesised (and the
    names those use, in turn): the same value wherever it is evaluated, with nothing left to
    look up. Templates use it for shape-dependent derived values in plans and for the named
    expressions of their first-pick rules."""
    if not names or not (names_in(text) & set(names)):
        return text

    class _Sub(ast.NodeTransformer):
        def visit_Name(self, node: ast.Name) -> ast.AST:
            if node.id in names:
                return ast.parse(inline(names[node.id], names), mode="eval").body
            return node

    # names_in above has parsed and checked the text; its cached tree is shared, so a fresh one is rewritten
    return ast.unparse(_Sub().visit(ast.parse(text.strip(), mode="eval")).body)
