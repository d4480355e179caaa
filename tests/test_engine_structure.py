"""The engine's structure (issue 37): one ShapeState per shape, one chooser interface, and the
ordered measure callbacks after each batch of results.

The evaluator pool is the test double ``fake_pool.FakeEvaluatorPool`` (no GPU here); templates,
operators, the archive and the engine are the real ones.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Optional, Sequence

import pytest

from evo.cli._orchestrate import make_operators
from evo.search import EngineServices, MeasureCallback, Measured
from evo.search._chooser import OperatorChooser, WeightedChooser
from evo.search._config import merge
from evo.search._engine import Engine
from evo.search._opbandit import BanditConfig, OperatorBandit
from evo.search._progress import EVENTS_FILE, EventLog, read_events
from evo.search._shape_state import ShapeState
from fake_pool import FakeEvaluatorPool
from operators import Operator, get_operator
from populations import Archive, Evaluation, KernelStats, Shape, Status, TimerResult, load_templates

TEMPLATES = load_templates()
SHAPES = [Shape.parse("256x256x256"), Shape.parse("64x128x64")]


class TellCountingDouble(Operator):
    """Test double: knob mutation that counts what it is told."""

    arity = 1
    name = "knob_mutation"

    def __init__(self) -> None:
        self.inner = get_operator("knob_mutation")
        self.told: list[str] = []

    def _propose(self, parents, shape, rng, n, context):  # type: ignore[no-untyped-def]
        return self.inner.propose(parents, shape, rng, n, context)

    def tell(self, candidate, evaluation) -> None:  # type: ignore[no-untyped-def]
        self.told.append(evaluation.candidate_id)


def _engine(archive: Archive, tmp_path: Path, operators: Optional[dict[str, Operator]] = None,
            **over: Any) -> Engine:
    cfg = merge(over, {"shapes": [str(s) for s in SHAPES], "archive": str(tmp_path / "a"),
                       "operators": "knob_mutation", "progress": "none", "max_evals": 40})
    return Engine(cfg, archive, FakeEvaluatorPool(delay_s=0.0),
                  operators if operators is not None else make_operators({"knob_mutation": 1.0}),
                  TEMPLATES, events=EventLog(tmp_path / "a" / EVENTS_FILE))


def _ok(cand_id: str, shape: Shape, fitness: float, median: float) -> Evaluation:
    timer = TimerResult(median, median, median, median * fitness, median * fitness, median * fitness, 5)
    return Evaluation(cand_id, shape, Status.OK, timers={"device": timer},
                      kernels=(KernelStats("k", registers=64),), correctness_s=0.01, timing_s=0.01)


# -- one record per shape -----------------------------------------------------------------------
def test_the_engine_keeps_one_record_per_shape_and_no_dict_keyed_by_shape_beside_it(tmp_path: Path) -> None:
    with Archive(tmp_path / "a", "w") as archive:
        engine = _engine(archive, tmp_path)
        by_shape = sorted(k for k, v in vars(engine).items()
                          if isinstance(v, (dict, set)) and v and all(isinstance(x, Shape) for x in v))
        assert by_shape == ["states"]
        result = engine.run()
        engine.events.close()
    assert result.reason == "evals"
    states = engine.states
    assert list(states) == SHAPES and all(isinstance(st, ShapeState) and st.shape == s for s, st in states.items())
    a, b = states[SHAPES[0]], states[SHAPES[1]]
    assert a.population is not b.population and a.queue is not b.queue and a.known is not b.known
    evaluated = [e for e in read_events(tmp_path / "a" / EVENTS_FILE) if e["event"] == "evaluation"]
    for shape, st in states.items():
        mine = [e["candidate"] for e in evaluated if e["shape"] == str(shape)]
        assert [c.id for c, _ in st.history] == mine  # the record saw what the events say, in order
        assert st.population.evaluated == len(mine) and set(mine) <= st.known and set(st.fitness_of) == set(mine)
        oks = [ev.timers["device"].median for _, ev in st.history if ev.fitness is not None and "device" in ev.timers]
        assert st.best_time == (min(oks) if oks else None)


def test_a_shape_state_observes_bans_and_tracks_its_best(tmp_path: Path) -> None:
    shape = SHAPES[0]
    cfg = merge({"allocation": {"stall_window": 4}}, {"shapes": [str(shape)], "archive": str(tmp_path / "a"),
                                                      "progress": "none"})
    st = ShapeState.start(shape, cfg, {n: t.family for n, t in TEMPLATES.items()})
    t = TEMPLATES["sm80_mma"]
    c1, c2, c3 = (t.candidate(k, shape) for k in t.sample(random.Random(3), shape, 3))
    assert st.observe(c1, _ok(c1.id, shape, 1.0, 2e-3)) is True
    assert st.observe(c2, _ok(c2.id, shape, 1.5, 1e-3)) is True and st.best_time == 1e-3
    assert st.observe(c3, Evaluation(c3.id, shape, Status.INCORRECT)) is False
    assert st.population.best is not None and st.population.best.id == c2.id
    assert st.fitness_of == {c1.id: 1.0, c2.id: 1.5, c3.id: None} and len(st.history) == 3
    assert [m.id for m in st.population.elites()] == [c2.id, c1.id]  # the incorrect one never joins
    assert not st.stalled(4) and not st.stalled(0)
    for _ in range(4):
        st.observe(c1, _ok(c1.id, shape, 1.0, 2e-3))
    assert st.stalled(4) and not st.stalled(0)
    assert st.elite_threshold(0.95) is None  # the elite set is not full yet


# -- one chooser interface ----------------------------------------------------------------------
@pytest.mark.parametrize("make", [lambda w: WeightedChooser(w), lambda w: OperatorBandit(w, BanditConfig(explore=0.2))],
                         ids=["weighted", "bandit"])
def test_every_chooser_speaks_the_engines_interface(make: Any) -> None:
    weights = {"knob_mutation": 2.0, "tpe": 1.0, "llm": 1.0}
    chooser = make(weights)
    assert isinstance(chooser, OperatorChooser)
    rng = random.Random(0)
    firsts = set()
    for _ in range(200):
        order = chooser.order(rng)
        assert sorted(order) == sorted(weights)  # every operator once
        firsts.add(order[0])
    assert firsts == set(weights)  # every operator is chosen first at times
    assert set(chooser.weights()) == set(weights) and all(w > 0 for w in chooser.weights().values())
    chooser.reward("tpe", True)
    chooser.reward("tpe", False)
    assert chooser.proposed["tpe"] == 2 and chooser.improved["tpe"] == 1
    chooser.charge("llm", 0.5, "")
    chooser.observe("llm", 0.1, 0.2, "")
    chooser.observe("knob_mutation", 0.0, 0.1, None)
    summary = chooser.summary()
    assert summary is None or (set(weights) <= set(summary) and summary["llm"]["llm_gpu_s"] == 0.5)


def test_the_engine_asks_no_chooser_which_kind_it_is() -> None:
    """The bandit's extra calls go through the interface: no isinstance check on a chooser."""
    search = Path(__file__).resolve().parents[1] / "evo" / "search"
    assert not [p.name for p in search.glob("*.py") if "isinstance(self.chooser" in p.read_text()
                or "isinstance(s.chooser" in p.read_text()]


# -- measure callbacks --------------------------------------------------------------------------
class OrderSpy(MeasureCallback):
    """Test double: checks that each batch it sees is archived, committed, recorded and told."""

    def __init__(self, commits: list[int], told: list[str]) -> None:
        self.commits, self.told, self.batches, self.last_commit = commits, told, 0, 0

    def apply(self, services: EngineServices, results: Sequence[Measured]) -> None:
        self.batches += 1
        assert self.commits[0] > self.last_commit  # committed since the last batch
        self.last_commit = self.commits[0]
        for m in results:
            for ev in m.evaluations:
                assert ev.candidate_id in {e.candidate_id for e in services.archive.evaluations(ev.shape)}
                st = services.states[ev.shape]
                assert ev.candidate_id in st.known and any(c.id == ev.candidate_id for c, _ in st.history)
                if m.job.operator == "knob_mutation":
                    assert ev.candidate_id in self.told


class RaisesOnce(MeasureCallback):
    """Test double: a callback that fails on its first batch."""

    def __init__(self) -> None:
        self.calls = 0

    def apply(self, services: EngineServices, results: Sequence[Measured]) -> None:
        self.calls += 1
        raise RuntimeError("callback double failed")


def test_callbacks_run_in_order_and_a_raising_one_is_dropped_with_an_event(tmp_path: Path) -> None:
    op = TellCountingDouble()
    with Archive(tmp_path / "a", "w") as archive:
        commits = [0]
        real_commit = archive.commit

        def counting_commit() -> None:
            commits[0] += 1
            real_commit()

        archive.commit = counting_commit  # type: ignore[method-assign]
        engine = _engine(archive, tmp_path, {"knob_mutation": op})
        bad, spy = RaisesOnce(), OrderSpy(commits, op.told)
        engine.callbacks += [bad, spy]
        result = engine.run()
        engine.events.close()
    assert result.reason == "evals" and result.evaluations == 40  # the failure did not end the run
    assert bad.calls == 1 and bad not in engine.callbacks and spy in engine.callbacks
    assert spy.batches > 1 and op.told  # the spy ran after the failure, on every batch
    failed = [e for e in read_events(tmp_path / "a" / EVENTS_FILE) if e["event"] == "hook_failed"]
    assert len(failed) == 1 and "callback double failed" in failed[0]["error"]


def test_an_essential_callback_that_raises_ends_the_run(tmp_path: Path) -> None:
    class EssentialRaises(RaisesOnce):
        essential = True

    with Archive(tmp_path / "a", "w") as archive:
        engine = _engine(archive, tmp_path)
        engine.callbacks.append(EssentialRaises())
        with pytest.raises(RuntimeError, match="callback double failed"):
            engine.run()
        engine.events.close()
    stop = [e for e in read_events(tmp_path / "a" / EVENTS_FILE) if e["event"] == "stop"]
    assert stop and stop[-1]["reason"] == "error"


def test_the_rl_updater_steps_as_the_last_callback_on_the_runs_evaluation_count(tmp_path: Path) -> None:
    """``evo run --rl-every`` wraps its updater (here a test double that notes its steps) in an
    RLCallback; appended last, it sees every batch's evaluations already counted."""
    from evo.cli._orchestrate import RLCallback

    class StepDouble:
        def __init__(self) -> None:
            self.steps: list[int] = []

        def step(self, evaluations: int) -> None:
            self.steps.append(evaluations)

    updater = StepDouble()
    with Archive(tmp_path / "a", "w") as archive:
        engine = _engine(archive, tmp_path)
        engine.callbacks.append(RLCallback(updater))
        engine.run()
        engine.events.close()
    assert updater.steps and updater.steps == sorted(updater.steps) and updater.steps[-1] == 40
