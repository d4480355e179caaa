"""The plan/constraint expression language: what it computes and what it refuses."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from populations._expr import ExprError, check_expr, evaluate, names_in, substitute


@pytest.mark.parametrize(
    "text, env, value",
    [
        ("cdiv(N, 128)", {"N": 257}, 3),
        ("min(M, 64) * max(K // 2, 1)", {"M": 100, "K": 1}, 64),
        ("BM % WM == 0 and SMEM <= 232448", {"BM": 128, "WM": 64, "SMEM": 1000}, 1),
        ("1 if K >= 4096 else 0", {"K": 8192}, 1),
        ("round_up(M, 16)", {"M": 17}, 32),
        ("not (M > 1)", {"M": 1}, 1),
        ("S > 1 and M * N * 4 * S or 0", {"S": 2, "M": 3, "N": 5}, 120),  # and/or give values, as in Python
        ("S > 1 and M * N * 4 * S or 0", {"S": 1, "M": 3, "N": 5}, 0),
        ("0 or K", {"K": 7}, 7),
        ("M and 0", {"M": 7}, 0),
        ("2 ** 10", {}, 1024),
        ("1 << 4 | 1", {}, 17),
        (64, {}, 64),
    ],
)
def test_evaluates(text, env, value) -> None:
    assert evaluate(text, env) == value


@pytest.mark.parametrize(
    "text",
    [
        "__import__('os').system('true')",
        "M.real",
        "[1, 2]",
        "lambda: 1",
        "open('x')",
        "M if",
        "1.5 * M",
        "'abc'",
        "x := 3",
        "M[0]",
        "cdiv(N, b=2)",
        "a" * 2000,
    ],
)
def test_refuses_code_outside_the_language(text) -> None:
    with pytest.raises(ExprError):
        evaluate(text, {"M": 1, "N": 2})


@pytest.mark.parametrize("text", ["M // 0", "M % 0", "cdiv(M, 0)", "2 ** 100", "1 << 80", "M ** -1", "Q + 1"])
def test_runtime_errors_are_expr_errors(text) -> None:
    with pytest.raises(ExprError):
        evaluate(text, {"M": 3})


def test_names_and_check() -> None:
    assert names_in("cdiv(N, BN) * SPLIT_K") == {"N", "BN", "SPLIT_K"}
    check_expr("cdiv(N, BN)", {"N", "BN"})
    with pytest.raises(ExprError, match="unknown name"):
        check_expr("cdiv(N, BN)", {"N"})


@given(st.integers(1, 10**6), st.integers(1, 4096))
def test_substitute_agrees_with_evaluate(n: int, bn: int) -> None:
    text = "cdiv(N, BN) * 2 + BN"
    partial = substitute(text, {"BN": bn})
    assert isinstance(partial, str) and "BN" not in names_in(partial)
    assert evaluate(partial, {"N": n}) == evaluate(text, {"N": n, "BN": bn})
    assert substitute(text, {"N": n, "BN": bn}) == evaluate(text, {"N": n, "BN": bn})


def test_inlining_leaves_the_parse_cache_alone() -> None:
    """``inline`` rewrites a fresh tree: the parser's cached tree of the same text (shared by every
    later evaluation) must not change. Rewriting the cached one made a plan of one template render
    with another's expressions (46048b9, caught by the operator conformance suite)."""
    from populations._expr import evaluate, inline

    text = "GRID * 2"
    assert evaluate(text, {"GRID": 3}) == 6
    assert inline(text, {"GRID": "cdiv(M, 64)"}) == "cdiv(M, 64) * 2"
    assert evaluate(text, {"GRID": 3}) == 6  # still the name, not the inlined expression
    assert inline(text, {"GRID": "K + 1"}) == "(K + 1) * 2"
