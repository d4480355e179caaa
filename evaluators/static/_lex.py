"""A small C++ lexer for the static scan: tokens and preprocessor directives, comments dropped.

Follows the translation phases closely enough for a filter: backslash-newlines are joined
first, then comments, string/char literals (raw strings too), identifiers, numbers and
punctuators are read; a ``#`` first on a line starts a directive that runs to the end of the
line. String contents are kept (inline PTX lives in them) but never scanned as identifiers,
so ``// cudaMalloc`` and ``"cudaMalloc"`` are not code.

Linear time: an unterminated comment, raw string, string or character literal is one ``bad``
token running to the end of the text (comment, raw string) or of the line (the others), so a
failed literal is read once, not once per quote after it (``"\\"\\"...`` was quadratic: minutes
for 128 KiB). The static scan refuses sources with ``bad`` tokens.
"""
from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["Token", "Directive", "lex"]

_TOKEN = re.compile(
    r"""
     (?P<ws>[ \t\r\f\v]+)
    |(?P<nl>\n)
    |(?P<lc>//[^\n]*)
    |(?P<bc>/\*.*?\*/)
    |(?P<raw>(?:u8|u|U|L)?R"(?P<delim>[^()\\\s"]{0,16})\((?P<rawbody>.*?)\)(?P=delim)")
    |(?P<str>(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*")
    |(?P<chr>(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*')
    |(?P<bad>/\*.*|(?:u8|u|U|L)?R"[^()\\\s"]{0,16}\(.*|(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*|(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*)
    |(?P<id>[A-Za-z_$][\w$]*)
    |(?P<num>\.?\d(?:[eEpP][+-]|[\w.']|)*)
    |(?P<punct><<<|<<=|>>=|\#\#|->\*|\.\.\.|::|->|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\|
               |[-+*/%^&|~!=<>?:;,.()\[\]{}\#@\\`])
    |(?P<other>.)
    """,
    re.X | re.S,
)


class Token(NamedTuple):  # a NamedTuple: a frozen dataclass made lexing 2x slower
    kind: str  # id | num | str | chr | punct | other | bad (an unterminated literal or comment)
    text: str  # for str/chr: the literal's contents without quotes or prefix
    line: int


class Directive(NamedTuple):
    name: str                  # "include", "define", ... ("" for a null directive)
    tokens: tuple[Token, ...]  # everything after the name
    text: str                  # the raw line after '#', comments removed
    line: int


def _literal_body(kind: str, m: re.Match[str]) -> str:
    if kind == "raw":
        return m.group("rawbody")
    text = m.group(kind)
    return text[text.index(text[-1]) + 1:-1] if len(text) >= 2 else ""


def lex(source: str) -> tuple[list[Token], list[Directive]]:
    """Split ``source`` into code tokens and directives (comments removed, lines joined)."""
    text = source.replace("\r\n", "\n").replace("\\\n", "")
    tokens: list[Token] = []
    directives: list[Directive] = []
    line = 1
    at_line_start = True
    current: list[Token] | None = None  # tokens of the directive being read
    raw_parts: list[str] = []
    dline = 0
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup or "other"
        if kind in ("delim", "rawbody"):
            kind = "raw"
        chunk = m.group(0)
        if kind == "nl" or (kind == "bc" and "\n" in chunk and current is not None):
            if current is not None:
                directives.append(_directive(current, "".join(raw_parts), dline))
                current = None
            line += chunk.count("\n")
            at_line_start = True
            continue
        if kind in ("ws", "lc", "bc"):
            line += chunk.count("\n")
            if current is not None and kind == "ws":
                raw_parts.append(" ")
            continue
        if kind == "punct" and chunk == "#" and at_line_start and current is None:
            current, raw_parts, dline = [], [], line
            at_line_start = False
            continue
        at_line_start = False
        if kind in ("raw", "str", "chr"):
            tok = Token("str" if kind != "chr" else "chr", _literal_body(kind, m), line)
        else:
            tok = Token(kind, chunk, line)
        line += chunk.count("\n")
        if current is not None:
            current.append(tok)
            raw_parts.append(chunk)
        else:
            tokens.append(tok)
    if current is not None:
        directives.append(_directive(current, "".join(raw_parts), dline))
    return tokens, directives


def _directive(toks: list[Token], raw: str, line: int) -> Directive:
    if toks and toks[0].kind == "id":
        name = toks[0].text
        rest = raw.split(name, 1)[1] if name in raw else ""
        return Directive(name, tuple(toks[1:]), rest.strip(), line)
    return Directive("", tuple(toks), raw.strip(), line)
