"""Slow (LLM-like) operators propose on threads: the engine keeps submitting other operators' work
meanwhile, and the token budget switches off only the operators that spend tokens.

The pool is the test double ``fake_pool.FakeEvaluatorPool``; the slow operator is a test double of
an LLM operator (a real one is in tests/test_llm_engine.py): it sleeps, reports tokens through
``take_tokens`` like ``LLMOperator`` (failed calls too), and samples knob sets.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from evo.search._config import merge
from evo.search._engine import Engine
from evo.search._progress import EVENTS_FILE, EventLog, read_events
from fake_pool import FakeEvaluatorPool
from operators import ModelOperator, get_operator
from populations import Archive, Shape, load_templates

TEMPLATES = load_templates()
SHAPE = Shape.parse("64x128x64")


class _SlowLLM(ModelOperator):
    """Test double of an LLM operator: ``delay_s`` per call, ``tokens`` per call, every other call fails."""

    name = "slow"
    arity = 1
    asynchronous = True

    def __init__(self, delay_s: float, tokens: int) -> None:
        self.delay_s, self.tokens = delay_s, tokens
        self.calls: list[tuple[float, float]] = []
        self.threads: set[str] = set()
        self._spent = 0
        self._lock = threading.Lock()

    def take_tokens(self) -> int:
        with self._lock:
            t, self._spent = self._spent, 0
        return t

    def _propose(self, parents, shape, rng, n, context):  # type: ignore[no-untyped-def]
        start = time.monotonic()
        self.threads.add(threading.current_thread().name)
        time.sleep(self.delay_s)
        with self._lock:
            self._spent += self.tokens
        self.calls.append((start, time.monotonic()))
        if len(self.calls) % 2 == 0:
            return [self.failure("no usable answer (test double)", parents)]
        t = context.template("sm80_mma")
        return [self.build(t, k, shape, parents, meta={"tokens": self.tokens}) for k in t.sample(rng, shape, n)]


class _TimedPool(FakeEvaluatorPool):
    def __init__(self) -> None:
        super().__init__(delay_s=0.02, fail=0.0, incorrect=0.0, crash=0.0, raise_=0.0)
        self.times: list[float] = []

    def submit(self, candidate, **kw):  # type: ignore[no-untyped-def]
        self.times.append(time.monotonic())
        return super().submit(candidate, **kw)


def _run(tmp_path: Path, slow: _SlowLLM, **limits):  # type: ignore[no-untyped-def]
    cfg = merge({}, {"shapes": [str(SHAPE)], "archive": str(tmp_path / "a"), "operators": "knob_mutation:1,slow:1",
                     "progress": "none", **limits})
    pool = _TimedPool()
    ops = {"knob_mutation": get_operator("knob_mutation"), "slow": slow}
    with Archive(tmp_path / "a", "w") as ar:
        events = EventLog(tmp_path / "a" / EVENTS_FILE)
        result = Engine(cfg, ar, pool, ops, {"sm80_mma": TEMPLATES["sm80_mma"]}, events=events).run()
        events.close()
    pool.close()
    return result, pool, read_events(tmp_path / "a" / EVENTS_FILE)


def test_slow_proposals_do_not_stall_submissions(tmp_path: Path) -> None:
    slow = _SlowLLM(delay_s=0.4, tokens=10)
    result, pool, events = _run(tmp_path, slow, budget="3s")
    assert result.reason == "wall" and result.evaluations >= 20
    assert slow.calls and all(name.startswith("evo-propose-slow") for name in slow.threads)
    during = [t for t in pool.times if any(a < t < b for a, b in slow.calls)]
    assert len(during) >= 5, (len(during), slow.calls)  # knob work went to the pool while the slow call ran
    ops = {e["operator"] for e in events if e["event"] == "evaluation"}
    assert "slow" in ops and "knob_mutation" in ops
    stop = [e for e in events if e["event"] == "stop"][0]
    assert len(slow.calls) >= 2 and stop["proposal_failures"]["slow: no usable answer (test double)"] >= 1


def test_token_budget_switches_off_only_the_token_spenders(tmp_path: Path) -> None:
    # The eval budget must outlast three LLM calls (0.15 s) by a wide margin: with 60 evaluations
    # an unloaded machine finished the knob work first (a clean-clone CI run).
    slow = _SlowLLM(delay_s=0.05, tokens=100)
    result, _, events = _run(tmp_path, slow, max_evals=400, max_tokens=250)
    assert result.reason == "evals" and result.budget["tokens"] >= 250  # knob work went on to the eval budget
    stopped = [e for e in events if e["event"] == "operators_stopped"]
    assert len(stopped) == 1 and stopped[0]["operators"] == ["slow"] and stopped[0]["budget"] == "tokens"
    at = stopped[0]["used"]["tokens"]
    assert result.budget["tokens"] <= at + 100  # at most the call already running when it stopped
    assert len(slow.calls) <= 4
