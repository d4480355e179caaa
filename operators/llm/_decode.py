"""The transformers backend's decoding loop: several rows of one prompt sampled together.

:func:`generate` is :meth:`TransformersBackend.complete_many`'s loop (issue 25): one prefill, the
KV cache expanded to the rows, one forward pass per step over the rows still decoding. Each row is
a generator (:func:`decode_row`) that yields the tokens it wants fed and is sent the logits after
them; a step feeds every live row the same number of its pending tokens (the fewest any row has
pending: a row's determined rest goes in one pass when it decodes alone, a token a step beside
rows that sample), so the cache stays rectangular with no padding.

A row under a grammar (a :class:`~._base.Choices`) chooses among its options token by token: only
tokens that keep the text on an allowed string are sampled, and where one string remains its rest
is fed at once. Rows of one call share *claims*: at each point they prefer options and tokens no
other row took there, so they branch where the grammar lets them instead of following the
model's favourite in lockstep (a sampling without replacement over the grammar's choices).
"""
from __future__ import annotations

import random
import time
from typing import Any, Generator, Optional, Sequence

from ._base import Choices, Completion
from ._steps import Cancelled

__all__ = ["generate", "decode_row"]

#: A row: yields tokens to feed, is sent the logits after them, returns (text, tokens, finished).
Row = Generator[list[int], Any, tuple[str, list[int], bool]]


class _Ledger:
    """Per-row wall and GPU seconds of one call: a step's cost is split evenly among the rows it fed."""

    def __init__(self, backend: Any, n: int) -> None:
        self.backend = backend
        self.seconds, self.gpu, self.waited = [0.0] * n, [0.0] * n, [0.0] * n
        self.begin(range(n))

    def begin(self, rows: Sequence[int]) -> None:
        """A step for ``rows`` starts (charged to them by :meth:`charge`, also when it is cancelled)."""
        self.rows, self.t0, self.g0 = rows, time.perf_counter(), self.backend._gpu_clock()

    def charge(self) -> None:
        dt = time.perf_counter() - self.t0
        (h1, w1), (h0, w0) = self.backend._gpu_clock(), self.g0
        for i in self.rows:
            self.seconds[i] += dt / len(self.rows)
            self.gpu[i] += (h1 - h0) / len(self.rows)
            self.waited[i] += (w1 - w0) / len(self.rows)


class _Rows:
    """The rows of one call: their generators, the tokens each still wants fed, their results."""

    def __init__(self, n: int) -> None:
        self.gens: list[Row] = []
        self.pending: list[list[int]] = [[] for _ in range(n)]
        self.results: list[Optional[tuple[str, list[int], bool]]] = [None] * n

    def start(self, row: Row) -> None:
        self.gens.append(row)
        self.advance(len(self.gens) - 1, None)

    def advance(self, i: int, logits: Any) -> None:
        """Send row ``i`` the logits after its pending tokens (None: start it)."""
        try:
            self.pending[i] = list(self.gens[i].send(logits))
        except StopIteration as stop:
            self.results[i] = stop.value

    def live(self, among: Sequence[int]) -> list[int]:
        return [i for i in among if self.results[i] is None]

    def close(self) -> None:
        for g in self.gens:
            g.close()


def generate(backend: Any, ids: list[int], grammars: list[Optional[Choices]], *, rng: random.Random,
             temperature: float, max_new_tokens: int, prefix: str) -> list[Completion]:
    """One completion per grammar after the prompt ``ids`` (see the module docstring and
    :meth:`TransformersBackend.complete_many`, whose lock the caller holds)."""
    n = len(grammars)
    ledger, rows = _Ledger(backend, n), _Rows(n)
    try:
        past, logits = backend._prefill(ids)
        if n > 1:
            backend._reshape_cache(past, repeat=n)
        ledger.charge()
        claims: Optional[dict[str, set[Any]]] = {} if n > 1 else None  # shared by the call's rows
        for i, g in enumerate(grammars):
            ledger.begin([i])
            rows.start(backend._row(g, logits, [], temperature, max_new_tokens, rng, shared=n > 1, claims=claims))
            ledger.charge()
        _steps(backend, past, rows, ledger)
    except Cancelled:
        ledger.charge()
    finally:
        rows.close()
    return _completions(backend, rows, ledger, len(ids), temperature, prefix)


def _steps(backend: Any, past: Any, rows: _Rows, ledger: _Ledger) -> None:
    """Decoding steps until every row is done: one forward pass each over the live rows."""
    cache_rows = list(range(len(rows.gens)))  # which row each row of the KV cache holds
    while True:
        live = rows.live(cache_rows)
        if not live:
            return
        ledger.begin(live)
        if len(live) < len(cache_rows):  # finished rows leave the cache
            backend._reshape_cache(past, keep=[cache_rows.index(i) for i in live])
            cache_rows = live
        k = min(len(rows.pending[i]) for i in live)
        feed = [rows.pending[i][:k] for i in live]
        for i in live:
            rows.pending[i] = rows.pending[i][k:]
        if len(live) == 1:
            past, last = backend._forward(feed[0], past)
            row_logits = [last]
        else:
            past, row_logits = backend._forward_rows(feed, past)
        for j, i in enumerate(live):
            if not rows.pending[i]:
                rows.advance(i, row_logits[j])
        ledger.charge()


def _completions(backend: Any, rows: _Rows, ledger: _Ledger, prompt_len: int, temperature: float,
                 prefix: str) -> list[Completion]:
    """The rows' completions; the prompt's tokens split evenly (the first ``len % n`` rows one more)."""
    n = len(rows.results)
    share, extra = divmod(prompt_len, n)
    out = []
    for i, result in enumerate(rows.results):
        prompt_tokens = share + (i < extra)
        if result is None:  # cancelled before this row finished
            out.append(backend.failure("cancelled", ledger.seconds[i], temperature, prompt_tokens,
                                       gpu_s=ledger.gpu[i], gpu_wait_s=ledger.waited[i]))
            continue
        text, new, finished = result
        out.append(Completion(text=prefix + text, prompt_tokens=prompt_tokens, completion_tokens=len(new),
                              seconds=ledger.seconds[i], model=backend.name, temperature=temperature,
                              finished=finished, adapter=getattr(backend, "adapter", ""), gpu_s=ledger.gpu[i],
                              gpu_wait_s=ledger.waited[i]))
    return out


# -- one row ----------------------------------------------------------------------------------
class _Claims:
    """What the rows of one call took: the text chosen so far -> the options rows took from
    there, and each point inside an option -> the tokens rows sampled there (None: one row alone)."""

    def __init__(self, table: Optional[dict[str, set[Any]]]) -> None:
        self.table = table

    def untaken(self, options: list[Any], at: str) -> list[Any]:
        """The options no row took at ``at``; all of them when every one is taken."""
        taken = self.table.get(at) if self.table is not None else None
        if not taken:
            return options
        return [o for o in options if o not in taken] or options

    def claim(self, at: str, option: Any) -> None:
        if self.table is not None:
            self.table.setdefault(at, set()).add(option)


def decode_row(backend: Any, grammar: Optional[Choices], logits: Any, new: list[int], temperature: float,
               max_new_tokens: int, rng: random.Random, shared: bool = False,
               claims: Optional[dict[str, set[Any]]] = None) -> Row:
    """One row's decoding, as a generator: ``logits = yield tokens`` asks for ``tokens`` to be
    fed and gets the logits after the last of them; it returns (text, tokens, finished). Free:
    sample until an end token or ``max_new_tokens``. Under a grammar: see :func:`_grammar_row`."""
    if grammar is None:
        return (yield from _free_row(backend, logits, new, temperature, max_new_tokens, rng))
    return (yield from _grammar_row(backend, grammar, logits, new, temperature, max_new_tokens, rng, shared,
                                    _Claims(claims)))


def _free_row(backend: Any, logits: Any, new: list[int], temperature: float, max_new_tokens: int,
              rng: random.Random) -> Row:
    finished = False
    while len(new) < max_new_tokens:
        tok = backend._sample(logits, None, temperature, rng)
        if tok in backend.eos:
            finished = True
            break
        new.append(tok)
        logits = yield [tok]
    return backend.tokenizer.decode(new, skip_special_tokens=True), new, finished


def _grammar_row(backend: Any, grammar: Choices, logits: Any, new: list[int], temperature: float,
                 max_new_tokens: int, rng: random.Random, shared: bool, claims: _Claims) -> Row:
    """Choose the grammar's options one after another (:func:`_option`) until it is done; a
    string is chosen (``grammar.choose``) as soon as it is determined, before its tokens are
    fed. With ``shared`` (rows of one call) the options are asked again after every token, so a
    grammar whose ``known`` sees other rows' choices steers this row off them within the step."""
    text = ""
    while not grammar.done and len(new) < max_new_tokens:
        live = claims.untaken(grammar.options(), text)
        if not live:
            return text, new, False
        chosen, logits = yield from _option(backend, grammar, live, text, logits, new, temperature, rng, shared,
                                            claims)
        if chosen is None:
            return text, new, False
        text += chosen
    return text, new, grammar.done


def _option(backend: Any, grammar: Choices, live: list[str], text: str, logits: Any, new: list[int],
            temperature: float, rng: random.Random, shared: bool, claims: _Claims
            ) -> Generator[list[int], Any, tuple[Optional[str], Any]]:
    """One option after ``text``, token by token among ``live``: (the option, the logits after
    it), or (None, ...) when no token or option is left."""
    done_text = ""
    while True:
        if len(live) == 1:  # determined: feed the rest at once
            claims.claim(text, live[0])
            grammar.choose(live[0])
            return live[0], (yield from _feed_rest(backend, live[0][len(done_text):], new, logits))
        step = _token_choices(backend.pieces, live, done_text)
        if not step:
            return None, logits
        at = f"{text}\x00{done_text}"  # this point inside an option: tokens are claimed too
        tok = backend._sample(logits, claims.untaken(list(step), at), temperature, rng)
        claims.claim(at, tok)
        new.append(tok)
        done_text += step[tok]
        live = [s for s in live if s.startswith(done_text)]
        chosen = live[0] if len(live) == 1 else None
        if chosen is None and hasattr(grammar, "narrow"):  # a grammar that reserves ahead (BatchClaims)
            grammar.narrow(live)
        if chosen is not None:  # chosen before its tokens are fed: rows after this one see it
            claims.claim(text, chosen)
            grammar.choose(chosen)
        logits = yield [tok]
        if chosen is not None:
            return chosen, (yield from _feed_rest(backend, chosen[len(done_text):], new, logits))
        if shared:  # another row's choice may have ruled options out (a grammar's `known`, a claim)
            live = claims.untaken([s for s in grammar.options() if s.startswith(done_text)], text)
            if not live:
                return None, logits


def _token_choices(pieces: dict[str, list[int]], live: list[str], done_text: str) -> dict[int, str]:
    """Token id -> the text it adds, for every token that keeps the text on one of ``live``."""
    step: dict[int, str] = {}
    for s in live:
        tail = s[len(done_text):]
        for cut in range(1, len(tail) + 1):
            for t in pieces.get(tail[:cut], ()):
                step[t] = tail[:cut]
    return step


def _feed_rest(backend: Any, rest: str, new: list[int], logits: Any) -> Generator[list[int], Any, Any]:
    """Feed the determined ``rest`` of an option (its tokens in one go); the logits after it."""
    if rest:
        toks = backend.tokenizer.encode(rest, add_special_tokens=False)
        new.extend(toks)
        logits = yield toks
    return logits
