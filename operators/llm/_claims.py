"""The knob sets the rows of one batched call finished on, and the one each unfinished row holds.

Rows of one :meth:`TransformersBackend.complete_many` call decode side by side under their own
:class:`~._grammar.KnobEditGrammar`; a set one row finishes on is known to the others, so no two
rows return the same child. That alone lets a row dead-end: it commits to part of an edit (a knob
name, or a value with another change to follow) while that part still had a free completion,
then other rows finish on every completion of it before its own next step, and its grammar has
nothing left to offer (9 of 64 rows at 32 rows a call, bench/RESULTS.md section 24). A row cannot
take back tokens it has fed, so it must keep a way out instead: whenever its grammar commits to
a part, the row *holds* one valid, new completion of that part, which the other rows treat as
known until the row finishes (on it or on another set) or moves to a part the held set does not
extend. A row's options then always include its held set's next step.

Before the last change a grammar offers every knob name that has a value valid now or after one
more change, whoever took it; here a name is offered only while it has a completion no other row
finished on or holds. Holds are taken where a grammar's option is determined (``choose``) and,
inside an option of several tokens, after each token (``narrow``, which the decoding loop calls):
a row typing ``16`` of ``GROUP`` holds a ``GROUP = 16`` set until it has typed the rest.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable, Iterable, Mapping, Optional

from populations import Shape, Template

from ._grammar import KnobEditGrammar, option_name, option_value

__all__ = ["BatchClaims"]

#: Checks one hold search may spend (``Template.check`` is ~0.1 ms for the largest template):
#: past it the row holds nothing and may dead-end as before.
SEARCH_CHECKS = 512


class BatchClaims:
    """Finished and held knob sets of one batched call; :meth:`grammars` gives its rows' grammars.

    ``known(knobs)`` says whether a full knob set was known before the call (the history, earlier
    calls); ``key(knobs)`` is the identity two rows must not share (the operator's, which
    normalises derived knobs); both default to the plain set."""

    def __init__(self, known: Optional[Callable[[Mapping[str, Any]], bool]] = None,
                 key: Optional[Callable[[Mapping[str, Any]], Hashable]] = None) -> None:
        self._before = known
        self._key = key or (lambda k: tuple(sorted(k.items())))
        self.finished: set = set()
        self._holder: dict[Hashable, int] = {}   # held key -> row
        self._held: dict[int, tuple[Hashable, dict[str, Any]]] = {}  # row -> (key, its edit)
        self.holds = 0  # holds taken, for tests and telemetry
        #: (template, shape, full knob set) -> whether it passes the template's checks there
        self.checked: dict[tuple, bool] = {}
        #: (edit so far, knob name) -> a free completion found for it, or None: none left
        self.free: dict[tuple, Optional[dict[str, Any]]] = {}

    def known(self, row: int, knobs: Mapping[str, Any]) -> bool:
        """Whether ``row`` may not finish on ``knobs``: known before, finished by a row, or held by another."""
        k = self._key(knobs)
        if k in self.finished or self._holder.get(k, row) != row:
            return True
        return bool(self._before and self._before(knobs))

    def finish(self, row: int, knobs: Mapping[str, Any]) -> None:
        self.release(row)
        self.finished.add(self._key(knobs))

    def hold(self, row: int, knobs: Mapping[str, Any], edit: Mapping[str, Any]) -> None:
        self.release(row)
        k = self._key(knobs)
        self._holder[k] = row
        self._held[row] = (k, dict(edit))
        self.holds += 1

    def release(self, row: int) -> None:
        old = self._held.pop(row, None)
        if old is not None and self._holder.get(old[0]) == row:
            del self._holder[old[0]]

    def held_edit(self, row: int) -> Optional[dict[str, Any]]:
        old = self._held.get(row)
        return old[1] if old is not None else None

    def grammars(self, template: Template, parent: Mapping[str, Any], shape: Optional[Shape], max_changes: int,
                 n: int) -> list[KnobEditGrammar]:
        """``n`` rows' grammars over this call's claims."""
        return [_HoldingGrammar(self, row, template, parent, shape, max_changes) for row in range(n)]


class _HoldingGrammar(KnobEditGrammar):
    """A row's knob-edit grammar that finishes into, and holds a completion in, its call's claims;
    before the last change it offers only knob names that still have a free completion."""

    def __init__(self, claims: BatchClaims, row: int, template: Template, parent: Mapping[str, Any],
                 shape: Optional[Shape], max_changes: int) -> None:
        super().__init__(template, parent, shape, max_changes, known=lambda k: claims.known(row, k))
        self.claims, self.row = claims, row

    def options(self) -> list[str]:
        out = super().options()
        if self.pending is None and len(self.edit) + 1 < self.max_changes:  # names before the last change
            out = [o for o in out if self._free(option_name(o))]
        return out

    def choose(self, option: str) -> None:
        super().choose(option)
        if self.done:
            self.claims.finish(self.row, {**self.parent, **self.edit})
            return
        self._keep_or_move(lambda held: self.pending in held if self.pending is not None
                           else len(held) > len(self.edit),  # more changes follow: the held edit must add one
                           [lambda: self._completion(self.pending)])

    def _keep_or_move(self, keeps: Callable[[Mapping[str, Any]], bool],
                      searches: Iterable[Callable[[], Optional[dict[str, Any]]]]) -> None:
        """Keep the row's hold where it still completes what the row committed to (the edit so far,
        and ``keeps``), else hold the first completion ``searches`` find, else hold nothing."""
        held = self.claims.held_edit(self.row)
        if held is not None and all(held.get(n, _MISSING) == v for n, v in self.edit.items()) and keeps(held):
            return
        for search in searches:
            found = search()
            if found is not None:
                self.claims.hold(self.row, {**self.parent, **found}, found)
                return
        self.claims.release(self.row)

    def _free(self, name: str) -> bool:
        """Whether committing to ``name`` now leaves a completion no one else has. The call's
        rows share the answers (a found completion is re-checked against the claims only; a name
        with none stays without: sets are only ever taken, save a hold moved elsewhere)."""
        memo = self.claims.free
        key = (tuple(sorted(self.edit.items())), name)
        hit = memo.get(key, _MISSING)
        if hit is None:
            return False
        if hit is not _MISSING and not self.known({**self.parent, **hit}):  # type: ignore[misc]
            return True
        found = self._completion(name)
        memo[key] = found
        return found is not None

    def narrow(self, options: list[str]) -> None:
        """Told by the decoding loop, after a token inside an option, the options the row's text
        still allows: the hold moves to a completion of one of them where it is on none (a row
        typing ``16`` must not lose every ``GROUP = 16`` set to other rows before its next token)."""
        self._keep_or_move(lambda held: any(self._allows(held, o) for o in options),
                           [lambda o=o: self._completion_of(o) for o in options])

    def _allows(self, held: Mapping[str, Any], option: str) -> bool:
        """Whether ``held`` (a completion of the edit so far) completes it with ``option`` chosen next."""
        if self.pending is None:
            return option_name(option) in held
        finish, value = option_value(option)
        if held.get(self.pending, _MISSING) != value:
            return False
        return len(held) == len(self.edit) + 1 if finish else len(held) > len(self.edit) + 1

    def _completion_of(self, option: str) -> Optional[dict[str, Any]]:
        if self.pending is None:
            return self._completion(option_name(option))
        finish, value = option_value(option)
        one, budget = {**self.edit, self.pending: value}, [SEARCH_CHECKS]
        if finish:
            return one if self._edit_ok(one, budget) else None
        return self._extend(one, budget)

    def _completion(self, pending: Optional[str]) -> Optional[dict[str, Any]]:
        """A valid completion of the committed part (``pending``: a name about to get its value)
        that no one else has (this row's own ``known``), within :data:`SEARCH_CHECKS` validity
        checks; None when there is none."""
        firsts = [pending] if pending is not None else \
            [n for n in self.template.space.knobs if n not in self.edit and self._values(n)]
        deeper = len(self.edit) + 2 <= self.max_changes
        budget = [SEARCH_CHECKS]
        for n in firsts:
            for v in self._values(n):
                one = {**self.edit, n: v}
                if self._edit_ok(one, budget):
                    return one
                two = self._extend(one, budget) if deeper else None
                if two is not None:
                    return two
                if budget[0] <= 0:
                    return None
        return None

    def _extend(self, one: dict[str, Any], budget: list[int]) -> Optional[dict[str, Any]]:
        """``one`` with one more knob changed, valid and free; None when none is (or the budget is spent)."""
        for m in self.template.space.knobs:
            if m in one:
                continue
            for w in self._values(m):
                two = {**one, m: w}
                if self._edit_ok(two, budget):
                    return two
                if budget[0] <= 0:
                    return None
        return None

    def _edit_ok(self, edit: Mapping[str, Any], budget: list[int]) -> bool:
        """Free (the claims, a set lookup) and valid (``Template.check``, which spends ``budget``)."""
        full = {**self.parent, **edit}
        if self.known(full):  # type: ignore[misc]
            return False
        budget[0] -= 1
        return self._checks(full)

    def _checks(self, full: Mapping[str, Any]) -> bool:
        """``Template.check`` once per knob set and call: the rows share a parent, so they ask
        about the same sets (most of a 64-row call's host time before this memo)."""
        key = (self.template.name, self.shape, tuple(sorted(full.items())))
        hit = self.claims.checked.get(key)
        if hit is None:
            hit = self.claims.checked[key] = super()._checks(full)
        return hit


_MISSING = object()

