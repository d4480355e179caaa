"""The engine in-process: selection, diversity, transfer, budgets, convergence, resume, events.

The evaluator pool is the test double ``fake_pool.FakeEvaluatorPool`` (no GPU here); templates,
operators, the archive and the engine are the real ones.
"""
from __future__ import annotations

import functools
import math
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import pytest

from evo.search._budget import Budget, Convergence
from evo.cli._orchestrate import expand_operators, make_operators
from evo.search._config import merge
from evo.search._engine import Engine, RunResult
from evo.search._progress import EVENTS_FILE, EventLog, read_events
from evo.search._selection import Population, feature_cell
from evo.search._transfer import nearest_shapes, shape_distance, transfer_candidates
from fake_pool import FakeEvaluatorPool, synthetic_fitness
from populations import Evaluation, KernelStats, Shape, Status, TimerResult, load_templates
from operators import Operator
from populations import Archive

TEMPLATES = load_templates()
BIG = Shape.parse("4096x4096x4096")
SMALL = Shape.parse("64x128x64")


def _ok(cand_id: str, shape: Shape, fitness: float, registers: int = 64) -> Evaluation:
    timer = TimerResult(1.0 / fitness, 1.0 / fitness, 1.0 / fitness, 1.0, 1.0, 1.0, 5)
    return Evaluation(cand_id, shape, Status.OK, timers={"device": timer},
                      kernels=(KernelStats("k", registers=registers),), correctness_s=0.01, timing_s=0.01)


@functools.lru_cache(maxsize=None)
def _candidates(shape: Shape, n: int, seed: int = 0, template: str = "sm80_mma") -> tuple:
    """``n`` rendered candidates of a template (cached: rendering is the slow part of these tests)."""
    t = TEMPLATES[template]
    return tuple(t.candidate(k, shape) for k in t.sample(random.Random(seed), shape, n))


def run_engine(archive_dir: Path, shapes: list[Shape], pool: Optional[FakeEvaluatorPool] = None,
               operators: str = "knob", **overrides: Any) -> tuple[RunResult, FakeEvaluatorPool]:
    overrides["pool"] = overrides.pop("pool_", None)
    cfg = merge({}, {"shapes": [str(s) for s in shapes], "archive": str(archive_dir), "operators": operators,
                     "progress": "none", **overrides})
    cfg.operators = expand_operators(cfg.operators)
    pool = pool or FakeEvaluatorPool(delay_s=0.0)
    events = EventLog(archive_dir / EVENTS_FILE) if archive_dir.exists() else None
    with Archive(archive_dir, "w") as archive:
        events = events or EventLog(archive_dir / EVENTS_FILE)
        engine = Engine(cfg, archive, pool, make_operators(cfg.operators), TEMPLATES, events=events)
        result = engine.run()
        events.close()
    pool.close()
    return result, pool


def _archived(archive_dir: Path) -> dict[Shape, list[Evaluation]]:
    with Archive(archive_dir, "r") as ar:
        return {s: ar.evaluations(s) for s in ar.shapes()}


# -- selection and diversity --------------------------------------------------------------------
def _population(n: int, **kw: Any) -> tuple[Population, list]:
    pop = Population(**kw)
    cands = _candidates(BIG, 40)[:n]
    for i, c in enumerate(cands):
        pop.add(c, _ok(c.id, BIG, 0.1 + i / n))
    return pop, cands


@pytest.mark.parametrize("method", ["tournament", "power"])
def test_selection_prefers_fitter_parents(method: str) -> None:
    pop, _ = _population(30, cells=False, size=30, elites=4)
    rng = random.Random(1)
    picks = [pop.select(rng, 1, method)[0].fitness for _ in range(2000)]
    uniform = sum(m.fitness for m in pop.pool()) / len(pop.pool())
    assert sum(picks) / len(picks) > uniform + 0.1  # clear pressure towards the fit
    best = pop.best.fitness
    assert picks.count(best) > 2000 / 30 * 2  # the best is drawn far more than its uniform share


def test_stronger_power_law_means_more_pressure() -> None:
    pop, _ = _population(30, cells=False, size=30)
    mean = {}
    for alpha in (0.5, 3.0):
        rng = random.Random(2)
        mean[alpha] = sum(pop.select(rng, 1, "power", alpha=alpha)[0].fitness for _ in range(1000)) / 1000
    assert mean[3.0] > mean[0.5]


def test_parents_are_distinct_and_elites_are_kept() -> None:
    pop, cands = _population(30, cells=False, size=10, elites=5)
    top5 = {m.id for m in pop.elites()}
    assert len(top5) == 5 and top5 <= {m.id for m in pop.pool()}
    for i, c in enumerate(_candidates(BIG, 40)[30:]):  # weaker newcomers do not push elites out
        pop.add(c, _ok(c.id, BIG, 0.05 + i * 1e-3))
    assert top5 == {m.id for m in pop.elites()} and top5 <= {m.id for m in pop.pool()}
    parents = pop.select(random.Random(0), 3, "tournament")
    assert len({p.id for p in parents}) == 3


def test_failures_and_banned_candidates_are_never_parents() -> None:
    pop, cands = _population(10, cells=False, size=10)
    best = pop.best
    assert not pop.add(cands[0], Evaluation(cands[0].id, BIG, Status.COMPILE_ERROR))
    pop.ban(best.id)
    assert best.id not in {m.id for m in pop.pool()} and pop.best.id != best.id
    assert not pop.add(best.candidate, best.evaluation)  # once incorrect, never back


def test_feature_cells_keep_a_weaker_kind_selectable() -> None:
    leader = [c for c in _candidates(BIG, 40) if c.knobs["BM"] == 128][:12]
    other = _candidates(BIG, 1, seed=4, template="sm90_wgmma")[0]
    for cells in (True, False):
        pop = Population(cells=cells, size=8, elites=4, families={t.name: t.family for t in TEMPLATES.values()})
        for i, c in enumerate(leader):
            pop.add(c, _ok(c.id, BIG, 1.0 + i / 100))
        pop.add(other, _ok(other.id, BIG, 0.3))
        assert (other.id in {m.id for m in pop.pool()}) is cells
    cell = feature_cell(other, _ok(other.id, BIG, 0.3, registers=90), {"sm90_wgmma": "B"})
    assert cell[0] == "B" and cell[1] == (other.knobs["BM"], other.knobs["BN"], other.knobs["BK"])
    assert cell[2] == other.knobs["STAGES"] and cell[3] == 90 // 32


def test_a_re_measurement_can_take_the_lead_and_a_cell_away() -> None:
    """A member's fitness is the median of its measurements, so a slower re-measurement lowers
    it: the lead and its diversity cell pass to the next best (each cell keeps its best member)."""
    first, second = _candidates(BIG, 2, seed=7)
    pop = Population(cells=True)
    pop.add(first, _ok(first.id, BIG, 2.0))
    pop.add(second, _ok(second.id, BIG, 1.5))
    assert pop.best.id == first.id
    pop.add(first, _ok(first.id, BIG, 0.5))
    assert pop.best.id == second.id and pop.best.fitness == 1.5
    assert pop.elites()[1].fitness == pytest.approx(1.25) and pop.elites()[1].measurements == 2
    for cell, champ in pop.cells().items():
        assert champ.fitness == max(m.fitness for m in pop.elites(10) if m.cell == cell)


def test_archive_and_engine_rank_alike_on_a_re_measured_candidate(tmp_path: Path) -> None:
    """One elite ranking: a candidate measured twice (1.0x, 1.6x: median 1.3x, best 1.6x) and
    one measured once at 1.4x. Ranked by the best measurement (the engine's former rule) the
    first leads; by the median (the archive's) the second. The archive and the engine rebuilt
    from it now give the same order and fitness."""
    twice, once, third = _candidates(BIG, 3, seed=5)
    with Archive(tmp_path / "a", "w") as archive:
        archive.record(twice, [_ok(twice.id, BIG, 1.0), _ok(twice.id, BIG, 1.6)])
        archive.record(once, [_ok(once.id, BIG, 1.4)])
        archive.record(third, [_ok(third.id, BIG, 1.2)])
        archived = [(e.candidate_id, e.fitness) for e in archive.elites(BIG)]
        cfg = merge({}, {"shapes": [str(BIG)], "archive": str(tmp_path / "a"), "progress": "none",
                         "operators": "knob"})
        cfg.operators = expand_operators(cfg.operators)
        events, pool = EventLog(tmp_path / "a" / EVENTS_FILE), FakeEvaluatorPool(delay_s=0.0)
        try:
            engine = Engine(cfg, archive, pool, make_operators(cfg.operators), TEMPLATES, events=events)
            engine._prepare()  # rebuild the populations from the archive, as a resumed run does
        finally:
            events.close()
            pool.close()
        ranked = [(m.id, m.fitness) for m in engine.states[BIG].population.elites()]
    assert archived[0] == (once.id, 1.4) and archived[1][0] == twice.id
    assert archived[1][1] == pytest.approx(1.3)
    assert ranked == archived
    assert engine.states[BIG].population.best.id == once.id


# -- transfer -----------------------------------------------------------------------------------
def test_shape_distance_is_log_space_and_layout_aware() -> None:
    assert shape_distance(BIG, Shape.parse("2048x4096x4096")) == pytest.approx(1.0)
    assert shape_distance(BIG, Shape.parse("1024x1024x1024")) == pytest.approx(math.sqrt(12))
    assert shape_distance(BIG, Shape.parse("4096x4096x4096:NN")) == math.inf
    assert shape_distance(BIG, Shape.parse("4096x4096x4096:f16")) == math.inf
    known = [Shape.parse(s) for s in ("4096x4096x4096", "1024x1024x1024", "64x64x64", "3000x3000x3000:NN")]
    assert nearest_shapes(Shape.parse("3000x3000x3000"), known, 2) == [known[0], known[1]]


def test_transfer_rerenders_elites_of_the_nearest_shapes(tmp_path: Path) -> None:
    near, far = Shape.parse("4096x4096x2048"), Shape.parse("64x64x64")
    target = Shape.parse("4096x4096x4096")
    with Archive(tmp_path / "a", "w") as ar:
        for shape, fit in ((near, 1.2), (far, 2.0)):
            for i, c in enumerate(_candidates(shape, 6, seed=5)):
                ar.record(c, [_ok(c.id, shape, fit - i * 0.1)])

        def elites_of(s: Shape, n: int) -> list:
            return [(e.candidate, e.latest) for e in ar.elites(s, n)]

        got = transfer_candidates(target, ar.shapes(), elites_of, TEMPLATES, neighbors=1, per_neighbor=3)
        best_near = [e.candidate for e in ar.elites(near, 3)]
    assert len(got) == 3
    for cand, parent in zip(got, best_near):
        assert cand.shapes == (target,) and cand.operator == "transfer" and cand.parents == (parent.id,)
        assert cand.template == parent.template and cand.knobs == parent.knobs
        assert cand.meta["transfer_from"] == str(near)


def test_a_new_shape_takes_its_own_picks_and_transfers_in_turn(tmp_path: Path) -> None:
    """Seeds and transferred elites alternate. A near archived shape (log2 distance <= 1) leads
    with its elites; a far one follows the shape's own first picks, so a run that gives each shape
    a few evaluations measures the picks made for it (not only kernels that won elsewhere)."""
    run_engine(tmp_path / "a", [BIG], max_evals=16, seed=1)
    # far: log2 distance 4; 512x4096x512 was far too, but most of 4096^3's elites re-render there as
    # its own picks (deduplicated), leaving 0-1 transfers by the thread timing of the fake pool
    near, far = Shape.parse("4096x4096x2048"), Shape.parse("1024x4096x1024")
    run_engine(tmp_path / "a", [near, far], max_evals=16, seed=1)
    events = read_events(tmp_path / "a" / EVENTS_FILE)
    for target, lead, follow in ((near, "transfer", "seed"), (far, "seed", "transfer")):
        mine = [e for e in events if e["shape"] == str(target)]
        seed = next(e for e in mine if e["event"] == "seed")
        assert seed["transferred"] >= 1 and seed["templates"] >= 1 and seed["lead"] == lead.replace("seed", "templates")
        proposals = [e["operator"] for e in mine if e["event"] == "proposal"]
        assert proposals[:4] == [lead, follow, lead, follow], (target, proposals)


# -- budgets and convergence -------------------------------------------------------------------
def test_evaluation_budget_is_exact_and_deduplicated(tmp_path: Path) -> None:
    # failure shares high enough that 40 candidates surely include failures whatever their ids (the
    # fake draws them from the id, and any template edit changes every id: at the default 10%, one
    # id set in 70 has none)
    result, pool = run_engine(tmp_path / "a", [BIG, SMALL], max_evals=40,
                              pool=FakeEvaluatorPool(delay_s=0.0, fail=0.2, incorrect=0.1, crash=0.05))
    assert result.reason == "evals" and result.evaluations == 40 and result.lost == 0
    evals = _archived(tmp_path / "a")
    assert sum(map(len, evals.values())) == 40
    for shape, evs in evals.items():
        ids = [e.candidate_id for e in evs]
        assert len(ids) == len(set(ids)), "a candidate was evaluated twice at one shape"
        assert 15 <= len(evs) <= 25  # shapes are served evenly
    assert 1 < pool.max_inflight <= 2 * 1 + 4
    statuses = Counter(e.status for evs in evals.values() for e in evs)
    assert statuses[Status.OK] > 0 and len(statuses) > 1  # the fake's failures reached the archive


def test_wall_budget_stops_on_time(tmp_path: Path) -> None:
    start = time.monotonic()
    result, _ = run_engine(tmp_path / "a", [BIG], pool=FakeEvaluatorPool(delay_s=0.05), budget="1s")
    took = time.monotonic() - start
    assert result.reason == "wall" and result.lost == 0
    assert 1.0 <= took < 4.0


def test_gpu_seconds_budget(tmp_path: Path) -> None:
    result, _ = run_engine(tmp_path / "a", [BIG], pool=FakeEvaluatorPool(gpu_s=0.1), gpu_seconds="1.5")
    assert result.reason == "gpu_seconds"
    spent = sum(e.correctness_s + e.timing_s for evs in _archived(tmp_path / "a").values() for e in evs)
    assert spent == pytest.approx(result.budget["gpu_s"])
    assert 1.5 <= spent <= 1.5 + 6 * 0.1 + 1e-9  # overshoot at most what was in flight


def test_budget_and_convergence_units() -> None:
    now = [0.0]
    b = Budget(wall_s=10, gpu_s=None, evals=3, tokens=100, clock=lambda: now[0])
    assert b.exhausted() is None and b.remaining_evals(1) == 2
    b.charge_tokens(100)
    assert b.exhausted() == "tokens"
    now[0] = 11
    assert b.exhausted() == "wall"
    c = Convergence(window=3, threshold=0.1)
    for f in (1.0, 1.05, None, 1.08):
        c.observe(f)
    assert c.converged  # 1.08 is within 10 % of the best before the window (1.0)
    c.observe(1.5)
    assert not c.converged
    assert not Convergence(window=None, threshold=0.1).converged


def test_converged_shapes_stop_the_run(tmp_path: Path) -> None:
    result, _ = run_engine(tmp_path / "a", [BIG, SMALL], converge_window=8, converge_threshold=5.0)
    assert result.reason == "converged"
    events = read_events(tmp_path / "a" / EVENTS_FILE)
    assert {e["shape"] for e in events if e["event"] == "converged"} == {str(BIG), str(SMALL)}
    assert result.evaluations < 60


# -- resume and the event log -------------------------------------------------------------------
def test_resume_continues_from_the_archive(tmp_path: Path) -> None:
    first, _ = run_engine(tmp_path / "a", [BIG], max_evals=30, seed=3)
    best1 = first.best[str(BIG)]
    second, pool = run_engine(tmp_path / "a", [BIG], max_evals=20, seed=3)
    evs = _archived(tmp_path / "a")[BIG]
    assert len(evs) == 50
    assert len({e.candidate_id for e in evs}) == 50
    assert second.best[str(BIG)] >= best1  # the population came back from the archive
    assert not set(pool.submitted) & {e.candidate_id for e in evs[:30]}
    events = read_events(tmp_path / "a" / EVENTS_FILE)
    assert [e["event"] for e in events].count("start") == 2
    assert [e for e in events if e["event"] == "seed"] and len([e for e in events if e["event"] == "seed"]) == 1


def test_unevaluated_candidates_of_a_killed_run_are_evaluated_on_resume(tmp_path: Path) -> None:
    orphans = _candidates(BIG, 3, seed=11)
    with Archive(tmp_path / "a", "w") as ar:
        for c in orphans:
            ar.add(c)  # submitted, then the run died before any result
    _, pool = run_engine(tmp_path / "a", [BIG], max_evals=5)
    assert pool.submitted[:3] == [c.id for c in orphans]


def test_event_log_lines_parse_and_tell_the_story(tmp_path: Path) -> None:
    result, _ = run_engine(tmp_path / "a", [BIG], max_evals=12)
    lines = (tmp_path / "a" / EVENTS_FILE).read_text().splitlines()
    events = read_events(tmp_path / "a" / EVENTS_FILE)
    assert len(events) == len(lines)
    assert all({"t", "event", "shape"} <= set(e) for e in events)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "stop" and "budget_stop" in kinds
    assert kinds.count("evaluation") == 12 and kinds.count("proposal") == 12
    assert "new_best" in kinds
    bests = [e["fitness"] for e in events if e["event"] == "new_best"]
    assert bests == sorted(bests) and bests[-1] == pytest.approx(result.best[str(BIG)])
    oks = [e["fitness"] for e in events if e["event"] == "evaluation" and e["status"] == "ok"]
    assert max(oks) == pytest.approx(bests[-1])


def test_pool_failures_become_runtime_errors(tmp_path: Path) -> None:
    result, _ = run_engine(tmp_path / "a", [BIG], pool=FakeEvaluatorPool(raise_=1.0), max_evals=6)
    evs = _archived(tmp_path / "a")[BIG]
    assert result.reason == "evals" and len(evs) == 6
    assert all(e.status is Status.RUNTIME_ERROR and "pool failed" in e.message for e in evs)


def test_a_pool_that_only_fails_stops_the_run(tmp_path: Path) -> None:
    result, _ = run_engine(tmp_path / "a", [BIG, SMALL], pool=FakeEvaluatorPool(crash=1.0, fail=0, incorrect=0),
                           pool_={"max_consecutive_errors": 10})
    assert result.reason == "pool_failing" and 10 <= result.evaluations <= 10 + 6


def test_search_improves_on_the_seeds(tmp_path: Path) -> None:
    run_engine(tmp_path / "a", [BIG], max_evals=90, seed=5)
    evs = _archived(tmp_path / "a")[BIG]
    with Archive(tmp_path / "a", "r") as ar:
        ops = {c.id: c.operator for c in ar.candidates(BIG)}
    seeds = [e.fitness for e in evs if ops[e.candidate_id] == "seed" and e.fitness]
    evolved = [e.fitness for e in evs if ops[e.candidate_id] != "seed" and e.fitness]
    assert max(evolved) > max(seeds)


def test_synthetic_fitness_is_deterministic() -> None:
    c = _candidates(BIG, 1)[0]
    assert synthetic_fitness(c, BIG) == synthetic_fitness(c, BIG)
    assert 0.2 < synthetic_fitness(c, BIG) <= 1.6


class _Echo(Operator):
    """An operator that only ever re-proposes its parent (what a stuck LLM operator does)."""

    name = "echo"
    arity = 1

    def _propose(self, parents, shape, rng, n, context):  # type: ignore[no-untyped-def]
        p = parents[0]
        return [self.build(context.template(p.template), p.knobs, shape, parents) for _ in range(n)]


def test_duplicates_are_never_evaluated_twice(tmp_path: Path) -> None:
    cfg = merge({}, {"shapes": [str(BIG)], "archive": str(tmp_path / "a"), "operators": "echo", "progress": "none",
                     "max_evals": 50})
    pool = FakeEvaluatorPool(fail=0, incorrect=0, crash=0, raise_=0)
    with Archive(tmp_path / "a", "w") as ar:
        events = EventLog(tmp_path / "a" / EVENTS_FILE)
        engine = Engine(cfg, ar, pool, {"echo": _Echo()}, TEMPLATES, events=events)
        result = engine.run()
        events.close()
    pool.close()
    assert result.reason == "exhausted" and engine.proposer.duplicates > 0
    assert len(pool.submitted) == len(set(pool.submitted)) == result.evaluations


class _Chatty(Operator):
    """Random knob sets, each reported as costing 50 LLM tokens (how an LLM operator reports)."""

    name = "chatty"
    arity = 0

    def _propose(self, parents, shape, rng, n, context):  # type: ignore[no-untyped-def]
        t = context.template("sm80_mma")
        return [self.build(t, k, shape, parents, meta={"tokens": 50}) for k in t.sample(rng, shape, n)]


def test_token_budget_counts_what_operators_report(tmp_path: Path) -> None:
    cfg = merge({}, {"shapes": [str(BIG)], "archive": str(tmp_path / "a"), "operators": "chatty",
                     "progress": "none", "max_tokens": 200})
    with Archive(tmp_path / "a", "w") as ar:
        events = EventLog(tmp_path / "a" / EVENTS_FILE)
        result = Engine(cfg, ar, FakeEvaluatorPool(), {"chatty": _Chatty()}, {"sm80_mma": TEMPLATES["sm80_mma"]},
                        events=events).run()
        events.close()
    assert result.reason == "tokens" and result.budget["tokens"] >= 200


def test_transfer_near_is_read_and_checked() -> None:
    """``[transfer] near`` comes from the run file; a negative distance is refused with its name."""
    from evo.search._config import ConfigError, merge

    cfg = merge({"shapes": ["64x64x64"], "archive": "x", "transfer": {"near": 2.5}}, {})
    assert cfg.transfer.near == 2.5 and merge({"shapes": ["64x64x64"], "archive": "x"}, {}).transfer.near == 1.0
    with pytest.raises(ConfigError, match="near"):
        merge({"shapes": ["64x64x64"], "archive": "x", "transfer": {"near": -1}}, {})
