"""The static scan's macro expansion (bounded, conservative) and the token helpers it shares with the
structural pass (:mod:`._structure`): a bracket matcher and an argument splitter."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ._lex import Token


#: Work units (tokens read, copied or emitted) the macro expansion may spend, 20x what our
#: largest template needs: past it the source is refused, so a macro bomb costs the scan
#: well under a second and no memory to speak of.
MAX_EXPANDED_TOKENS = 400_000


@dataclass(frozen=True)
class _Macro:
    params: tuple[str, ...] | None  # None: object-like
    variadic: bool
    body: list[Token]


class _ScanLimit(Exception):
    """The scan's work budget ran out (a macro bomb, a pathological source): a rejection, not a crash."""


class _Expander:
    """Macro expansion for the structural pass, close enough to the C preprocessor for a filter.

    Object- and function-like macros (``__VA_ARGS__`` and ``#param`` included; ``##`` is
    refused before we get here); arguments are expanded before substitution; a macro is not
    re-expanded inside itself; depth is bounded. Conditionals are not evaluated, so every
    branch is scanned, and ``#undef`` is ignored (conservative).

    Bounded work: every token read, copied or emitted, at any depth (argument expansion
    included: ``#define T(x) x x`` nested is exponential in its output *and* in the work before
    it), costs one unit of ``budget``; running out raises :class:`_ScanLimit`, which the scan
    turns into a rejection (a macro bomb used to cost tens of seconds and gigabytes here).
    """

    def __init__(self, macros: Mapping[str, _Macro], budget: int = MAX_EXPANDED_TOKENS) -> None:
        self.macros = macros
        self.left = budget
        self.truncated = False

    def _charge(self, n: int) -> None:
        self.left -= n
        if self.left < 0:
            self.truncated = True
            raise _ScanLimit(f"macro expansion exceeds {MAX_EXPANDED_TOKENS} tokens (a macro bomb?)")

    def expand(self, tokens: list[Token], active: frozenset[str] = frozenset(), depth: int = 0) -> list[Token]:
        out: list[Token] = []
        i = 0
        while i < len(tokens):
            self._charge(1)
            t = tokens[i]
            m = self.macros.get(t.text) if t.kind == "id" and t.text not in active and depth < 32 else None
            if m is None or (m.params is not None and (i + 1 >= len(tokens) or tokens[i + 1].text != "(")):
                out.append(t)
                i += 1
                continue
            if m.params is None:
                body, i = m.body, i + 1
            else:
                close = _match(tokens, i + 1)
                self._charge(close - i)
                body = self._substitute(m, _split_args(tokens[i + 2:close]), active, depth)
                i = close + 1
            self._charge(len(body))
            moved = [Token(b.kind, b.text, t.line) for b in body]
            out.extend(self.expand(moved, active | {t.text}, depth + 1))
        return out

    def _substitute(self, m: _Macro, args: list[list[Token]], active: frozenset[str], depth: int) -> list[Token]:
        env = {p: args[k] if k < len(args) else [] for k, p in enumerate(m.params or ())}
        if m.variadic:
            rest = args[len(m.params or ()):]
            env["__VA_ARGS__"] = [x for k, a in enumerate(rest) for x in ([Token("punct", ",", 0)] if k else []) + a]
        out: list[Token] = []
        skip = False
        for k, b in enumerate(m.body):
            self._charge(1)
            if skip:
                skip = False
                continue
            if b.text == "#" and k + 1 < len(m.body) and m.body[k + 1].text in env:
                arg = env[m.body[k + 1].text]
                self._charge(len(arg))
                out.append(Token("str", " ".join(x.text for x in arg), b.line))
                skip = True
            elif b.kind == "id" and b.text in env:
                out.extend(self.expand(env[b.text], active, depth + 1))
            else:
                out.append(b)
        return out


def _split_args(tokens: list[Token]) -> list[list[Token]]:
    args: list[list[Token]] = [[]]
    depth = 0
    for t in tokens:
        if t.text in ("(", "[", "{"):
            depth += 1
        elif t.text in (")", "]", "}"):
            depth -= 1
        if t.text == "," and depth == 0:
            args.append([])
        else:
            args[-1].append(t)
    return args if tokens else []


def _match(tokens: list[Token] | tuple[Token, ...], i: int) -> int:
    """Index of the bracket closing the one at ``i`` (or the last index if unbalanced)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    open_, close = tokens[i].text, pairs[tokens[i].text]
    depth = 0
    for j in range(i, len(tokens)):
        if tokens[j].kind == "punct":
            if tokens[j].text == open_:
                depth += 1
            elif tokens[j].text == close:
                depth -= 1
                if depth == 0:
                    return j
    return len(tokens) - 1
