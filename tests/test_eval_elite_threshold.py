"""The memoisation timing pass only for would-be elites (issue 4 throughput): the engine sends the
elite cutoff with each job once the elite set is full, the worker's harness skips the pass below
it, and the pass's decision is recorded. Also the CPU-checkable parts of the VA-reserved buffers
(issue 5): canaries that fill a whole oversized block, and the after-timing recheck driven by one
call-every-set function (the harness replays the timer's graph there)."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional

import pytest

sys.path.insert(0, str(Path(__file__).parent))

torch = pytest.importorskip("torch")

from fake_pool import FakeEvaluatorPool  # noqa: E402
from populations import Shape  # noqa: E402
from test_engine import run_engine  # noqa: E402

from evaluators.correctness import Guarded, recheck_sets  # noqa: E402
from evaluators.run._gates import memo_wanted  # noqa: E402


class _ThresholdPool(FakeEvaluatorPool):
    """The fake pool, recording the ``elite_threshold`` each ``submit`` got."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.thresholds: list[Optional[float]] = []

    def submit(self, candidate, *, elite_threshold: Optional[float] = None):  # type: ignore[override]
        self.thresholds.append(elite_threshold)
        return super().submit(candidate, elite_threshold=elite_threshold)


def test_engine_sends_the_elite_cutoff_once_the_elite_set_is_full(tmp_path):
    pool = _ThresholdPool(delay_s=0.0)
    result, _ = run_engine(tmp_path / "a", [Shape.parse("64x128x64")], pool=pool, max_evals=40, seed=1,
                           selection={"elites": 4})
    assert result.evaluations >= 40
    first = next(i for i, t in enumerate(pool.thresholds) if t is not None)
    assert first >= 4  # nothing before four members could fill the elite set
    sent = [t for t in pool.thresholds if t is not None]
    assert sent and all(t > 0 for t in sent)
    assert sent == sorted(sent)  # the cutoff of a growing population only rises


def test_a_pool_that_ignores_the_threshold_runs_the_same(tmp_path):
    pool = FakeEvaluatorPool(delay_s=0.0)  # takes elite_threshold and ignores it (the base allows that)
    result, _ = run_engine(tmp_path / "b", [Shape.parse("64x128x64")], pool=pool, max_evals=20, seed=1)
    assert result.evaluations >= 20


def test_memo_pass_runs_only_at_or_above_the_threshold():
    dev = {"median": 2e-6, "baseline_median": 3e-6}  # speedup 1.5
    assert memo_wanted({}, dev) == "run"
    assert memo_wanted({"elite_threshold": None}, dev) == "run"
    assert memo_wanted({"elite_threshold": 1.5}, dev) == "run"
    why = memo_wanted({"elite_threshold": 1.6}, dev)
    assert why.startswith("skipped") and "1.500" in why and "1.600" in why
    assert memo_wanted({"memo_check": False}, dev) == "off"


def test_guarded_canaries_cover_a_whole_oversized_block():
    gen = torch.Generator().manual_seed(3)
    got = []

    def block_alloc(n):  # a test double of the VA-reserved allocator: whole 1 MiB blocks
        t = torch.empty(-(-n // (1 << 20)) * (1 << 20), dtype=torch.uint8)
        got.append(t)
        return t
    g = Guarded(3, 5, torch.device("cpu"), gen, guard_bytes=512, alloc=block_alloc)
    assert g.full.numel() * 2 == (1 << 20)  # the block, in fp16 elements
    assert g.guards_intact()
    g.data.fill_(1.0)
    assert g.guards_intact()
    g.full[-1] = 7.0  # the far end of the block, well past the requested band: still a canary
    assert not g.guards_intact()


def test_recheck_with_one_call_for_every_set_matches_the_eager_loop():
    gen = torch.Generator().manual_seed(5)
    sets, m, n, k = 4, 8, 6, 16
    a3 = torch.empty(sets, m, k, dtype=torch.float16).uniform_(-1, 1, generator=gen)
    b3 = torch.empty(sets, n, k, dtype=torch.float16).uniform_(-1, 1, generator=gen)
    c3 = torch.empty(sets, m, n, dtype=torch.float16)
    calls = []

    def honest(i):
        calls.append(i)
        c3[i] = (a3[i].double() @ b3[i].double().t()).half()
    all_calls = []

    def every_set():
        all_calls.append(1)
        for i in range(sets):
            honest(i)
    recheck_sets(a3, b3, c3, "TN", honest, lambda: None, gen, call_all=every_set)
    assert len(all_calls) == 3  # one per pass; the repeat pass's extra call stays a single call
    assert calls.count(sets - 1) == 4

    memo = {}

    def stale(i):  # per-set memo: right once, stale after in-place changes
        if i not in memo:
            honest(i)
            memo[i] = c3[i].clone()
        c3[i] = memo[i]
    for i in range(sets):
        stale(i)
    with pytest.raises(Exception, match="outputs after timing"):
        recheck_sets(a3, b3, c3, "TN", stale, lambda: None, gen, call_all=lambda: [stale(i) for i in range(sets)])


def test_a_per_shape_threshold_judges_each_claimed_shape_by_its_own_cutoff():
    """A candidate claiming two shapes can become an elite at either: the gate reads the shape
    being timed, and a shape with no known cutoff (left out, or None) always runs the checks."""
    from evaluators.run._gates import host_timers_wanted

    dev = {"median": 2e-6, "baseline_median": 3e-6}  # speedup 1.5
    a, b, c = Shape.parse("64x128x64"), Shape.parse("128x128x64"), Shape.parse("256x128x64")
    job = {"elite_threshold": {str(a): 1.6, str(b): 1.2, str(c): None}}
    assert memo_wanted(job, dev, a).startswith("skipped")
    assert memo_wanted(job, dev, b) == "run" and memo_wanted(job, dev, c) == "run"
    assert memo_wanted(job, dev, Shape.parse("512x128x64")) == "run"  # not in the mapping
    assert memo_wanted(job, dev) == "run"  # no shape given: no cutoff to apply
    assert host_timers_wanted(job, 1.5, a).startswith("skipped") and host_timers_wanted(job, 1.5, b) == "run"


def test_engine_sends_each_claimed_shapes_cutoff_for_a_multi_shape_candidate(tmp_path):
    """The threshold a multi-shape job carries is per shape: the cutoff of the proposing shape
    must not let the candidate skip the memo pass where it would be an elite of another one."""
    from evo.search._config import merge
    from evo.search._engine import Engine
    from evo.cli._orchestrate import expand_operators, make_operators
    from evo.search._progress import EVENTS_FILE, EventLog
    from populations import Archive, load_templates

    small, big, other = Shape.parse("64x128x64"), Shape.parse("128x256x64"), Shape.parse("256x256x256")
    cfg = merge({}, {"shapes": [str(small), str(big)], "archive": str(tmp_path / "a"), "operators": "knob",
                     "progress": "none", "max_evals": 30, "selection": {"elites": 3}})
    cfg.operators = expand_operators(cfg.operators)
    pool = FakeEvaluatorPool(delay_s=0.0)
    with Archive(tmp_path / "a", "w") as archive:
        events = EventLog(tmp_path / "a" / EVENTS_FILE)
        engine = Engine(cfg, archive, pool, make_operators(cfg.operators), load_templates(), events=events)
        engine.run()
        events.close()
        one = archive.candidates(small)[0]
    pool.close()
    assert engine._elite_threshold(small) is not None and engine._elite_threshold(big) is not None
    assert engine._elite_thresholds(one.derive(shapes=(small,)), small) == engine._elite_threshold(small)
    multi = one.derive(shapes=(small, big, other))
    sent = engine._elite_thresholds(multi, small)
    assert sent == {str(small): engine._elite_threshold(small), str(big): engine._elite_threshold(big),
                    str(other): None}


def test_plain_allocations_are_warned_once_by_the_engine_and_by_evo_eval(tmp_path):
    """A worker whose driver refused VA reservations checks in plain allocations; the run goes
    on, and says so once (an event and a progress line), as `evo eval` does on stderr."""
    import dataclasses

    from evaluators import buffers_warning
    from evo.search._progress import EVENTS_FILE, read_events

    assert buffers_warning({}) is None and buffers_warning({"buffers": {"allocator": "vmm"}}) is None
    assert "plain allocations (torch)" in buffers_warning({"buffers": {"allocator": "torch"}})

    class _PlainBuffersPool(FakeEvaluatorPool):
        """The fake pool, its results stamped as a torch-allocator worker's would be."""

        def _evaluate(self, candidate):  # type: ignore[override]
            return [dataclasses.replace(e, provenance={**e.provenance, "buffers": {"allocator": "torch"}})
                    for e in super()._evaluate(candidate)]

    result, _ = run_engine(tmp_path / "a", [Shape.parse("64x128x64")], pool=_PlainBuffersPool(delay_s=0.0),
                           max_evals=12, seed=1)
    assert result.evaluations >= 12
    warnings = [e for e in read_events(tmp_path / "a" / EVENTS_FILE) if e["event"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["what"] == "buffers" and "not sure to fault" in warnings[0]["message"]
