"""The JSON knob-edit grammar of one template, parent and shape, as successive finite choices.

An edit reads ``{"NAME": VALUE, "NAME": VALUE}``; the operator puts ``{"`` in the answer's
prefix, then each choice is one prefix-free string: a knob name with its ``": `` (a knob not yet
edited that has another value), then a value with what follows it (``, "`` for another knob or
``}`` to finish). A value may finish the edit only when the knob set it gives passes
``Template.check``; at the last allowed change only such values are offered, and only knob
names that have one; before it, only names with a value that is valid or that one more change
makes valid (a knob whose other values the shape forbids, such as a ragged-K path at an aligned
K, is never offered). So every finished edit is valid; a rare dead end (no knob can complete a
valid set) ends unfinished and becomes a counted failure.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping, Optional

from populations import Shape, Template

__all__ = ["KnobEditGrammar", "PREFIX"]

PREFIX = '{"'
#: What follows a knob name in its option, and a value in its option when the edit ends or goes on.
NAME_END, EDIT_END, EDIT_MORE = '": ', "}", ', "'


def option_name(option: str) -> str:
    """The knob name of a name option (``BM": ``)."""
    return option[:-len(NAME_END)]


def option_value(option: str) -> tuple[bool, Any]:
    """(the edit ends, the value) of a value option (``64}`` or ``64, "``)."""
    finish = option.endswith(EDIT_END)
    return finish, json.loads(option[:-len(EDIT_END)] if finish else option[:-len(EDIT_MORE)])

#: Memo of :meth:`KnobEditGrammar._live_names` (oldest dropped first).
_LIVE: dict[tuple, frozenset] = {}
_LIVE_MAX = 256


class KnobEditGrammar:
    """Choices that spell a valid JSON knob edit of ``parent`` (see the module docstring)."""

    def __init__(self, template: Template, parent: Mapping[str, Any], shape: Optional[Shape], max_changes: int = 2,
                 known: Optional[Callable[[Mapping[str, Any]], bool]] = None) -> None:
        self.template = template
        self.shape = shape
        self.parent = template.space.complete(parent)
        self.max_changes = max(1, max_changes)
        self.known = known  # full knob sets not to finish on (already in the history or the batch)
        self.edit: dict[str, Any] = {}
        self.pending: Optional[str] = None
        self.done = False

    def _valid(self, name: str, value: Any) -> bool:
        full = {**self.parent, **self.edit, name: value}
        return not (self.known and self.known(full)) and self._checks(full)

    def _checks(self, full: Mapping[str, Any]) -> bool:
        """Whether the full knob set passes ``Template.check`` at the shape (a subclass may memoise it)."""
        return not self.template.check(full, self.shape)

    def _values(self, name: str) -> list[Any]:
        return [v for v in self.template.space.knobs[name].values if v != self.parent[name]]

    def options(self) -> list[str]:
        if self.done:
            return []
        last = len(self.edit) + 1 >= self.max_changes
        if self.pending is None:
            names = [n for n in self.template.space.knobs if n not in self.edit and self._values(n)]
            if last:
                names = [n for n in names if any(self._valid(n, v) for v in self._values(n))]
            else:  # a name none of whose values is valid, or valid after one more change, is a dead end
                live = self._live_names()
                names = [n for n in names if n in live]
            return [n + NAME_END for n in names]
        out = []
        for v in self._values(self.pending):
            if self._valid(self.pending, v):
                out.append(json.dumps(v) + EDIT_END)
            if not last and self._completable(self.pending, v):
                out.append(json.dumps(v) + EDIT_MORE)
        return out

    def json_schema(self) -> dict[str, Any]:
        """The edit as a JSON schema, for servers that decode under one (vLLM, SGLang, hosted APIs):
        known knobs, each with its other values, one to ``max_changes`` of them. Constraints
        between knobs are not expressible there: the answer is still validated after."""
        props = {n: {"enum": self._values(n)} for n in self.template.space.knobs if self._values(n)}
        return {"type": "object", "properties": props, "additionalProperties": False,
                "minProperties": 1, "maxProperties": self.max_changes}

    def _completable(self, name: str, value: Any) -> bool:
        """Whether, after ``name = value``, one more knob can give a valid set (the next is the last
        change) or any other knob is left (more changes follow): no dead end one step ahead."""
        others = [n for n in self.template.space.knobs if n not in self.edit and n != name and self._values(n)]
        if len(self.edit) + 2 < self.max_changes:
            return bool(others)
        self.edit[name] = value
        try:
            return any(self._valid(n, v) for n in others for v in self._values(n))
        finally:
            del self.edit[name]

    def _live_names(self) -> frozenset[str]:
        """Knobs not yet edited with a value that is valid, or valid after one more change (beside
        this edit; ``known`` sets aside, which only ever rules out a few). Rows of a call share a
        parent and shape, so the answer is memoised per (template, parent, shape, edit): tens of
        milliseconds of checks at the first name of a large template, once."""
        key = (self.template.name, self.template.source_text, tuple(sorted(self.parent.items())), self.shape,
               tuple(sorted(self.edit.items())))
        hit = _LIVE.get(key)
        if hit is not None:
            return hit
        ok = lambda full: not self.template.check(full, self.shape)  # noqa: E731
        base = {**self.parent, **self.edit}
        free = [n for n in self.template.space.knobs if n not in self.edit]

        def reachable(name: str, value: Any) -> bool:
            one = {**base, name: value}
            return ok(one) or any(ok({**one, n: v}) for n in free if n != name for v in self._values(n))

        live = frozenset(n for n in free if any(reachable(n, v) for v in self._values(n)))
        if len(_LIVE) >= _LIVE_MAX:
            _LIVE.pop(next(iter(_LIVE)))
        _LIVE[key] = live
        return live

    def choose(self, option: str) -> None:
        if self.pending is None:
            self.pending = option_name(option)
            return
        finish, value = option_value(option)
        self.edit[self.pending] = value
        self.pending = None
        self.done = finish
