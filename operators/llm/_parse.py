"""Parsing model answers, strict and forgiving at once.

Forgiving about wrapping (prose around the answer, a missing closing fence, a language tag or
none, trailing whitespace in SEARCH lines, ``"128"`` for an int knob); strict about meaning
(a SEARCH text must match exactly one place, a knob must exist and take a value of its domain,
the resulting knob set must pass ``Template.check``). Every function returns a :class:`Parsed`
(a value, or the reason there is none) and never raises on a bad answer.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from populations import Shape, Template

__all__ = ["Parsed", "code_blocks", "parse_source", "parse_edits", "apply_edits", "parse_knob_edit"]

_FENCE = re.compile(r"```([A-Za-z0-9_+\-]*)[ \t]*\n(.*?)(?:\n```|\Z)", re.S)
_EDIT = re.compile(r"<{5,}\s*SEARCH[ \t]*\n(.*?)\n?={5,}[ \t]*\n(.*?)\n?>{5,}\s*REPLACE", re.S)


@dataclass(frozen=True)
class Parsed:
    """A parsed value, or ``None`` and the reason (a counted failure)."""

    value: Any = None
    reason: str = ""

    @property
    def ok(self) -> bool:
        return not self.reason


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of each fenced block; an unclosed last fence runs to the end."""
    return [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(text or "")]


def parse_source(text: str) -> Parsed:
    """The translation unit of an answer: the longest cuda/c++ block (or any block, or bare code)."""
    blocks = code_blocks(text)
    cuda = [b for lang, b in blocks if lang in ("cuda", "cu", "cpp", "c++", "c")] or [b for _, b in blocks]
    if not cuda and "__global__" in (text or ""):
        cuda = [text]
    if not cuda:
        return Parsed(reason="no code block in the answer")
    src = max(cuda, key=len).strip()
    if "__global__" not in src:
        return Parsed(reason="the code block has no __global__ kernel")
    if 'extern "C"' not in src:
        return Parsed(reason='the kernel is not extern "C" (the ABI needs unmangled names)')
    return Parsed(src + "\n")


def parse_edits(text: str) -> Parsed:
    """The (search, replace) pairs of an answer, in order."""
    edits = [(m.group(1), m.group(2)) for m in _EDIT.finditer(text or "")]
    if not edits:
        return Parsed(reason="no SEARCH/REPLACE edit in the answer")
    if any(not s.strip() for s, _ in edits):
        return Parsed(reason="an edit has an empty SEARCH text")
    return Parsed(edits)


def _loose(lines: str) -> str:
    return "\n".join(line.rstrip() for line in lines.splitlines())


def apply_edits(source: str, edits: list[tuple[str, str]]) -> Parsed:
    """Apply edits in order: each SEARCH must match exactly once (exactly, else ignoring trailing spaces)."""
    out = source
    for i, (search, replace) in enumerate(edits, 1):
        count = out.count(search)
        if count == 1:
            out = out.replace(search, replace, 1)
            continue
        if count > 1:
            return Parsed(reason=f"edit {i}: SEARCH text occurs {count} times; it must be unique")
        loose_out, loose_search = _loose(out), _loose(search)
        count = loose_out.count(loose_search) if loose_search.strip() else 0
        if count != 1:
            first = search.strip().splitlines()[0][:80]
            why = "not found" if count == 0 else f"occurs {count} times"
            return Parsed(reason=f"edit {i}: SEARCH text {why} in the parent (first line: {first!r})")
        out = loose_out.replace(loose_search, replace, 1)
    if out == source:
        return Parsed(reason="the edits leave the source unchanged")
    return Parsed(out)


def _json_object(text: str) -> Optional[str]:
    for lang, body in code_blocks(text):
        if "{" in body:
            text = body
            break
    start = (text or "").find("{")
    if start < 0:
        return None
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i + 1]
    return text[start:] + "}"  # forgiving: a missing closing brace


def _coerce(value: Any, domain: tuple) -> tuple[bool, Any]:
    if value in domain and type(value) is type(domain[0]):
        return True, value
    kind = type(domain[0])
    if kind is int and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        value = int(value)
    elif kind is bool and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"
    elif kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    return (value in domain and type(value) is kind), value


def parse_knob_edit(text: str, template: Template, parent: Mapping[str, Any], shape: Optional[Shape] = None) -> Parsed:
    """The full knob set an answer's JSON edit gives ``parent``, checked against ``template``'s space."""
    raw = _json_object(text)
    if raw is None:
        return Parsed(reason="no JSON object in the answer")
    try:
        edit = json.loads(raw)
    except json.JSONDecodeError as exc:
        return Parsed(reason=f"the JSON edit does not parse: {exc.msg} at column {exc.colno}")
    if not isinstance(edit, dict) or not edit:
        return Parsed(reason="the JSON edit is empty or not an object")
    knobs = dict(parent)
    for name, value in edit.items():
        knob = template.space.knobs.get(name)
        if knob is None:
            return Parsed(reason=f"unknown knob {name!r} for template {template.name}")
        ok, value = _coerce(value, knob.values)
        if not ok:
            return Parsed(reason=f"knob {name}: {edit[name]!r} is not one of {list(knob.values)}")
        knobs[name] = value
    full = template.space.complete(knobs)
    if full == template.space.complete(parent):
        return Parsed(reason="the edit changes no knob")
    reasons = template.check(full, shape)
    if reasons:
        return Parsed(reason="the edited knobs are invalid: " + "; ".join(reasons))
    return Parsed(full)
