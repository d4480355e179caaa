"""Operator conformance (every registered operator) and the structured operators' own behaviour.

The conformance suite runs each name of ``available_operators()`` over the real seed templates
and a synthetic one written here (knobs on all four axes, a shape-dependent constraint), through
the scenarios an engine produces: a normal history, an empty one, unfit parents, parents of two
templates, a parent not built from a template, and a template that is not loaded.
"""
from __future__ import annotations

import copy
import random
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

import pytest

from operators import (OPERATOR_ERROR, KnobCrossover, KnobMutation, ModelOperator, ModelUsage, Operator,
                       OperatorContext, ParentView, Proposal, available_operators, get_operator, model_face, model_usage,
                       register_operator, registered_operators)
from operators._knobs import neighbour
from populations import (Candidate, Evaluation, Knob, LaunchPlan, Launch, Shape, Status, Template, TimerResult,
                         load_template, load_templates)

SYNTH_TOML = """
name = "synth"
family = "A"
description = "synthetic template for operator tests: knobs on every axis, one shape-dependent constraint"
min_arch = 80
layouts = ["TN", "NN"]
contracts = ["f32"]
source = "kernel.cu"

[knobs.BM]
values = [32, 64, 128, 256]
default = 128
axis = "tiling"
[knobs.BN]
values = [32, 64, 128, 256]
default = 128
axis = "tiling"
[knobs.BK]
values = [16, 32, 64]
default = 32
axis = "tiling"
[knobs.WM]
values = [16, 32, 64, 128]
default = 64
axis = "tiling"
[knobs.STAGES]
values = [2, 3, 4, 5, 6]
default = 3
axis = "loops"
[knobs.UNROLL]
values = [1, 2, 4, 8]
default = 1
axis = "loops"
[knobs.PAD]
values = [0, 8, 16]
default = 8
axis = "padding"
[knobs.SWZ]
values = ["none", "xor2", "xor4"]
default = "none"
axis = "swizzle"
[knobs.SPLIT_K]
values = [1, 2, 4, 8]
default = 1
axis = "splitk"
[knobs.EPI_SMEM]
values = [false, true]
default = false
axis = "epilogue"

[derived]
THREADS = "(BM // WM) * 128"
SMEM = "STAGES * (BM + BN) * (BK + PAD) * 2"

[[constraints]]
expr = "BM % WM == 0"
reason = "BM must be a multiple of WM"
[[constraints]]
expr = "THREADS <= 1024"
reason = "at most 1024 threads per block"
[[constraints]]
expr = "SMEM <= 98304"
reason = "shared memory above 96 KiB"
[[constraints]]
expr = "not (SWZ != SWZ_none and PAD > 0)"
reason = "swizzle and padding are alternatives"
[[constraints]]
expr = "SPLIT_K * BK <= K"
reason = "every K split needs a BK tile"

[plan]
workspace = "SPLIT_K * M * N * 4 if SPLIT_K > 1 else 0"
[[plan.launches]]
kernel = "evo_gemm"
grid = ["cdiv(N, BN)", "cdiv(M, BM)", "SPLIT_K"]
block = ["THREADS", 1, 1]
smem = "SMEM"
args = ["A", "B", "C", "workspace", "M", "N", "K"]
"""

OTHER_TOML = """
name = "other"
family = "T"
min_arch = 80
layouts = ["TN", "NN"]
contracts = ["f32"]
source = "kernel.cu"
[knobs.TILE]
values = [8, 16, 32, 64]
default = 16
axis = "tiling"
[knobs.KU]
values = [1, 2, 4]
default = 1
axis = "loops"
[derived]
THREADS = "TILE * 4"
[plan]
[[plan.launches]]
kernel = "evo_gemm"
grid = ["cdiv(N, TILE)", "cdiv(M, TILE)", 1]
block = ["THREADS", 1, 1]
args = ["A", "B", "C", "M", "N", "K"]
"""

KERNEL = 'extern "C" __global__ void evo_gemm(const void* A, const void* B, void* C, int M, int N, int K) {}\n'
SHAPE = Shape(1000, 768, 512)           # ragged M, K deep enough for split-K
SMALL = Shape(64, 96, 80, "NN")        # tiny applies; SPLIT_K * BK <= 80 rules much out
DECODE = Shape(8, 768, 512)            # the TN-only decode families (gemv, swab) apply
WEIGHTS = Shape(16, 2048, 2048)        # swpipe too: its decode rows stream >= 8 MB of weights


def write_template(root: Path, toml: str) -> Template:
    name = toml.split('name = "')[1].split('"')[0]
    folder = root / name
    folder.mkdir()
    (folder / "template.toml").write_text(toml)
    (folder / "kernel.cu").write_text(KERNEL)
    return load_template(folder)


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Template]:
    root = tmp_path_factory.mktemp("templates")
    out = dict(load_templates(errors="warn"))
    for toml in (SYNTH_TOML, OTHER_TOML):
        t = write_template(root, toml)
        out[t.name] = t
    return out


def evaluation(cand: Candidate, shape: Shape, speedup: float | None, status: Status = Status.OK) -> Evaluation:
    """A measured evaluation (speedup over a 1.0 s baseline), or a failure when ``speedup`` is None."""
    if speedup is None:
        return Evaluation(cand.id, shape, Status.COMPILE_ERROR if status is Status.OK else status, message="synthetic failure")
    timer = TimerResult(1.0 / speedup, 0.9 / speedup, 1.1 / speedup, 1.0, 0.9, 1.1, 10)
    return Evaluation(cand.id, shape, status, timers={"device": timer})


def history_for(template: Template, shape: Shape, count: int, seed: int, fail_every: int = 4) -> list[tuple[Candidate, Evaluation]]:
    rng = random.Random(seed)
    out = []
    for i, knobs in enumerate(template.sample(rng, shape, count)):
        cand = template.candidate(knobs, shape)
        out.append((cand, evaluation(cand, shape, None if i % fail_every == 3 else rng.uniform(0.2, 1.5))))
    return out


def plain_candidate(shape: Shape) -> Candidate:
    """A candidate not built from a template (what an LLM operator writes)."""
    plan = LaunchPlan(launches=(Launch(kernel="evo_gemm", grid=(1, 1, 1), block=(32, 1, 1), smem=0,
                                       args=("A", "B", "C", "M", "N", "K")),))
    return Candidate(source=KERNEL, plan=plan, shapes=(shape,), operator="llm_mutation")


def scenarios(templates: dict[str, Template]) -> dict[str, tuple[list[ParentView], OperatorContext, Shape]]:
    synth, other = templates["synth"], templates["other"]
    hist = history_for(synth, SHAPE, 16, seed=1) + history_for(other, SHAPE, 4, seed=2)
    fit = sorted((p for p in hist if p[1].fitness), key=lambda p: -p[1].fitness)
    unfit = [p for p in hist if p[1].fitness is None and p[0].template == "synth"]
    plain = plain_candidate(SHAPE)
    full = OperatorContext(hist, templates, arch=90)
    return {
        "normal": ([ParentView(*fit[0]), ParentView(*next(p for p in fit[1:] if p[0].template == fit[0][0].template))], full, SHAPE),
        "empty": ([], OperatorContext((), templates, arch=90), SHAPE),
        "unfit": ([ParentView(unfit[0][0], unfit[0][1]), ParentView(unfit[1][0], None)], full, SHAPE),
        "two_templates": ([ParentView(*next(p for p in fit if p[0].template == "other")),
                           ParentView(*next(p for p in fit if p[0].template == "synth"))], full, SHAPE),
        "plain_parent": ([ParentView(plain, None), ParentView(plain, None)], full, SHAPE),
        "not_loaded": ([ParentView(*fit[0])] * 2, OperatorContext(hist, {"other": other}, arch=90), SHAPE),
        "small_nn": ([ParentView(synth.candidate({"BK": 16}, SMALL)),
                      ParentView(synth.candidate({"BK": 32, "STAGES": 4, "PAD": 0}, SMALL))],
                     OperatorContext((), templates, arch=80), SMALL),
    }


SCENARIOS = ["normal", "empty", "unfit", "two_templates", "plain_parent", "not_loaded", "small_nn"]
#: every available operator; the LLM ranker scores 64 children with the real model per call, about a
#: minute on this CPU, so it runs under -m slow
OPERATORS = [pytest.param(n, marks=pytest.mark.slow) if n == "llm_ranked" else n for n in available_operators()]


def run(name: str, parents: list[ParentView], context: OperatorContext, shape: Shape, seed: int, n: int = 4) -> list[Proposal]:
    op = get_operator(name)
    return op.propose(parents[:max(op.arity, 2)], shape, random.Random(seed), n, context)


# -- conformance ------------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("name", OPERATORS)
def test_conformance(name: str, scenario: str, templates: dict[str, Template]) -> None:
    parents, context, shape = scenarios(templates)[scenario]
    op = get_operator(name)
    assert isinstance(op, Operator) and op.name == name and op.arity in (0, 1, 2)
    frozen = copy.deepcopy((parents, context.history, dict(context.templates)))
    proposals = run(name, parents, context, shape, seed=7)
    assert (parents, context.history, dict(context.templates)) == frozen, "the operator changed its inputs"
    assert 1 <= len(proposals) <= 4
    given = {p.id for p in parents}
    ids = []
    for p in proposals:
        assert isinstance(p, Proposal) and p.operator == name
        assert set(p.parents) <= given
        if not p.ok:
            assert p.reason.strip() and not p.reason.startswith(OPERATOR_ERROR), p.reason
            continue
        cand = p.candidate
        assert cand.operator == name and cand.shapes == (shape,)
        assert cand.parents == p.parents and set(cand.parents) <= given
        if op.arity >= 1:
            assert cand.parents, "a mutation or crossover child must name its parent(s)"
        template = context.templates[cand.template]
        assert template.check(cand.knobs, shape) == [], (cand.template, cand.knobs)
        source, plan = template.render(cand.knobs, shape, specialize=not cand.generic)
        assert (source, plan) == (cand.source, cand.plan)
        plan.resolve(shape)
        assert cand.id not in context.known_ids
        ids.append(cand.id)
    assert len(ids) == len(set(ids)), "ids within one batch must be unique"
    # the same seed gives the same proposals from a fresh instance
    again = run(name, parents, context, shape, seed=7)
    assert [(p.candidate.id if p.ok else p.reason) for p in again] == [(p.candidate.id if p.ok else p.reason) for p in proposals]
    # where a candidate is possible, the operator must produce one
    if scenario in ("normal", "two_templates", "small_nn") or (scenario in ("empty", "plain_parent") and op.arity == 0):
        assert any(p.ok for p in proposals), [p.reason for p in proposals]
    if scenario in ("empty", "plain_parent") and op.arity >= 1:
        assert not any(p.ok for p in proposals)


@pytest.mark.parametrize("name", OPERATORS)
def test_conformance_real_templates(name: str, templates: dict[str, Template]) -> None:
    """Every seed template in populations/templates, as a parent pair and as history."""
    real = [t for t in templates.values() if t.name not in ("synth", "other")]
    assert real, "no seed template loaded"
    for t in real:
        shape = next(s for s in (SHAPE, SMALL, DECODE, WEIGHTS) if t.applicable(s))
        hist = history_for(t, shape, 6, seed=3, fail_every=3)
        context = OperatorContext(hist, {t.name: t}, arch=90)
        fit = [ParentView(c, e) for c, e in hist if e.fitness]
        proposals = run(name, fit[:2], context, shape, seed=11, n=3)
        assert any(p.ok for p in proposals), (t.name, [p.reason for p in proposals])
        for p in proposals:
            assert p.ok or not p.reason.startswith(OPERATOR_ERROR), p.reason
            if p.ok:
                assert t.check(p.candidate.knobs, shape) == [] and p.candidate.id not in context.known_ids


#: the members only model-backed operators have (operators.ModelOperator)
MODEL_MEMBERS = ("asynchronous", "concurrency", "batch", "outcomes", "cancel", "take_tokens", "take_gpu_seconds",
                 "take_gpu_wait_seconds", "warm")


@pytest.mark.parametrize("name", OPERATORS)
def test_conformance_model_members(name: str) -> None:
    """Model-backed members are a ModelOperator's alone, and model_face/model_usage read them for
    any operator: the operator itself, or the defaults of one that calls no model."""
    op = get_operator(name)
    face = model_face(op)
    calls_a_model = name.startswith(("llm", "ranked"))  # the LLM operators, the cost-model rankers
    assert isinstance(op, ModelOperator) == calls_a_model
    if calls_a_model:
        assert face is op
    else:
        assert face is not op and not [m for m in MODEL_MEMBERS if hasattr(op, m)]
    assert isinstance(face.asynchronous, bool) and face.concurrency >= 1 and face.batch >= 1
    assert face.outcomes is None or all(isinstance(c, Mapping) for c in face.outcomes.values())
    usage = model_usage(op)  # nothing proposed yet: nothing spent
    assert usage.tokens in (None, 0) and usage.gpu_s == 0.0 and usage.gpu_wait_s == 0.0
    face.cancel()  # nothing running: a no-op, never an error


def test_a_model_operator_has_the_defaults_of_no_model_until_it_overrides_them() -> None:
    class CountingDouble(ModelOperator):
        """Test double of a model-backed operator: spends 7 tokens and 0.5 GPU-s per call."""
        name, arity, batch = "counting", 0, 4

        def __init__(self) -> None:
            self.spent = 0

        def _propose(self, parents, shape, rng, n, context):  # type: ignore[override]
            self.spent += 7
            return [self.failure("a double makes nothing")]

        def take_tokens(self) -> int:
            spent, self.spent = self.spent, 0
            return spent

        def take_gpu_seconds(self) -> float:
            return 0.5

    op = CountingDouble()
    assert model_face(op) is op and not op.asynchronous and op.concurrency == 1 and op.warm() == {}
    op.propose([], SHAPE, random.Random(0), 4)
    assert model_usage(op) == ModelUsage(tokens=7, gpu_s=0.5, gpu_wait_s=0.0)
    assert model_usage(op).tokens == 0  # taken: the counter restarts
    assert model_usage(get_operator("knob_mutation")) == ModelUsage(None, 0.0, 0.0)


def test_propose_refuses_bad_arguments_but_never_raises_for_bad_parents(templates: dict[str, Template]) -> None:
    op = get_operator("knob_mutation")
    with pytest.raises(ValueError):
        op.propose([], SHAPE, random.Random(0), -1)
    with pytest.raises(TypeError):
        op.propose([("not", "a view")], SHAPE, random.Random(0), 1)  # type: ignore[list-item]
    assert op.propose([], SHAPE, random.Random(0), 0) == []
    [fail] = op.propose([], SHAPE, random.Random(0), 3)
    assert not fail.ok and "needs a parent" in fail.reason


def test_an_exception_inside_an_operator_is_a_counted_failure() -> None:
    class Broken(Operator):
        name, arity = "broken", 0

        def _propose(self, parents, shape, rng, n, context):  # type: ignore[override]
            raise RuntimeError("boom")

    [p] = Broken().propose([], SHAPE, random.Random(0), 2)
    assert not p.ok and p.reason == f"{OPERATOR_ERROR}RuntimeError: boom"


def test_proposal_is_a_candidate_or_a_reason() -> None:
    with pytest.raises(ValueError):
        Proposal(operator="x")
    with pytest.raises(ValueError):
        Proposal(operator="x", candidate=plain_candidate(SHAPE), reason="both")


# -- registry ------------------------------------------------------------------------------------
def test_registry(templates: dict[str, Template]) -> None:
    assert {"knob_mutation", "knob_crossover", "knob_random"} <= set(available_operators())
    assert set(available_operators()) <= set(registered_operators())
    with pytest.raises(KeyError, match="knob_mutation"):
        get_operator("no_such_operator")
    op = get_operator("knob_mutation", max_changes=1)
    assert isinstance(op, KnobMutation) and op.max_changes == 1 and op.name == "knob_mutation"
    register_operator("test_pad_only", KnobMutation, axes=("padding",), max_repair=0, replace=True)
    assert "test_pad_only" in available_operators()
    register_operator("test_needs_missing", KnobMutation, requires=("no_such_package_xyz",), extra="nothing", replace=True)
    assert "test_needs_missing" not in available_operators() and "test_needs_missing" in registered_operators()
    with pytest.raises(ImportError, match=r"evo-hgemm\[nothing\]"):
        get_operator("test_needs_missing")
    with pytest.raises(ValueError, match="already registered"):
        register_operator("knob_mutation", KnobMutation)


# -- knob mutation -------------------------------------------------------------------------------------
def _parent(templates: dict[str, Template], **knobs: Any) -> ParentView:
    cand = templates["synth"].candidate({"BM": 128, "BN": 128, "BK": 32, "WM": 64, "STAGES": 3, "PAD": 8, **knobs}, SHAPE)
    return ParentView(cand, evaluation(cand, SHAPE, 1.0))


def test_mutation_changes_few_knobs_near_the_parent_on_every_axis(templates: dict[str, Template]) -> None:
    synth = templates["synth"]
    parent = _parent(templates)
    op = get_operator("knob_mutation")
    context = OperatorContext((), templates)
    proposals = [p for seed in range(200) for p in op.propose([parent], SHAPE, random.Random(seed), 1, context)]
    kids = [p.candidate for p in proposals if p.ok]
    assert len(kids) == 200, Counter(p.reason for p in proposals if not p.ok)
    changes = Counter()
    axes: set[str] = set()
    steps = []
    for kid in kids:
        changed = [k for k in kid.knobs if kid.knobs[k] != parent.knobs[k]]
        assert 1 <= len(changed) <= op.max_changes + op.max_repair
        changes[len(changed)] += 1
        axes |= {synth.space.knobs[k].axis for k in changed}
        if len(changed) == 1 and synth.space.knobs[changed[0]].kind == "int" and len(synth.space.knobs[changed[0]].values) > 2:
            values = sorted(synth.space.knobs[changed[0]].values)
            steps.append(abs(values.index(kid.knobs[changed[0]]) - values.index(parent.knobs[changed[0]])))
    assert changes[1] >= 0.4 * len(kids), changes          # often one knob at a time (repairs add some)
    assert sum(k * v for k, v in changes.items()) / len(kids) <= 2.0, changes
    assert {"tiling", "loops", "padding", "swizzle"} <= axes  # every axis gets its turn
    assert steps and sum(s == 1 for s in steps) >= 0.7 * len(steps), Counter(steps)  # neighbours in ordered domains
    # one batch: distinct children, until the neighbourhood runs out
    batch = op.propose([parent], SHAPE, random.Random(0), 40, context)
    ids = [p.candidate.id for p in batch if p.ok]
    assert len(ids) >= 30 and len(ids) == len(set(ids))


def test_neighbour_steps_are_local_in_ordered_domains() -> None:
    knob = Knob("T", tuple(8 * 2 ** i for i in range(8)), 128, "tiling")
    rng = random.Random(0)
    steps = Counter(abs(knob.values.index(neighbour(knob, 128, rng)) - 4) for _ in range(2000))
    assert steps[0] == 0 and steps[1] >= 0.6 * 2000 and steps[1] + steps[2] >= 0.8 * 2000, steps
    uniform = Counter(abs(knob.values.index(neighbour(knob, 128, rng, locality=0.0)) - 4) for _ in range(2000))
    assert uniform[1] < 0.4 * 2000, uniform  # the same statistic without locality: the check can fail
    flag = Knob("F", (False, True), False, "epilogue")
    assert neighbour(flag, False, rng) is True
    word = Knob("S", ("a", "b", "c"), "a", "swizzle")
    assert {neighbour(word, "a", rng) for _ in range(50)} == {"b", "c"}


def test_neighbour_walks_the_feasible_values_when_told_which() -> None:
    knob = Knob("BN", tuple(range(8, 264, 8)), 128, "tiling")
    rng = random.Random(0)
    def wide(v: int) -> bool:  # sm90_wgmma's BN in NN: 4 of 32 widths
        return v % 64 == 0
    asked: list[int] = []
    picks = Counter(neighbour(knob, 128, rng, locality=1.0, feasible=lambda v: asked.append(v) or wide(v))
                    for _ in range(400))
    assert set(picks) == {64, 192, 256}, picks  # steps of one or two feasible values, nothing between
    assert picks[64] + picks[192] >= 0.6 * 400, picks
    assert max(abs(v - 128) for v in asked) <= 128  # asked lazily, nearest first, never the whole domain at once
    assert neighbour(knob, 256, rng, locality=1.0, feasible=wide) in (192, 128)  # the top end turns back
    nothing = Counter(neighbour(knob, 128, rng, locality=1.0, feasible=lambda v: False) for _ in range(200))
    assert set(nothing) <= {112, 120, 136, 144}, nothing  # none feasible: the plain walk, for repair to fix
    jumps = {neighbour(knob, 128, rng, locality=0.0, feasible=wide) for _ in range(300)}
    assert any(not wide(v) for v in jumps)  # the non-local jump ignores feasibility


def test_mutation_moves_a_mostly_invalid_knob_as_often_in_nn_as_in_tn(templates: dict[str, Template]) -> None:
    """sm90_wgmma's BN holds 32 widths of which NN admits 4: before mutation walked the feasible
    values, BN moved in 1 of 300 NN mutants against 30 of 300 in TN (a step of 8 was invalid)."""
    t = templates["sm90_wgmma"]
    moved = {}
    for layout in ("TN", "NN"):
        shape = Shape(777, 1536, 2880, layout=layout)
        base = {name: knob.default for name, knob in t.space.knobs.items()} | {"BN": 128, "STAGES": 4}
        assert not t.check(base, shape)
        names = [k for k, knob in t.space.knobs.items() if len(knob.values) > 1]
        op, rng = KnobMutation(), random.Random(1)
        kids = [op._one(t, base, names, shape, rng, set(), False)[0] for _ in range(200)]
        assert all(k is not None and not t.check(k, shape) for k in kids)
        moved[layout] = sum(k["BN"] != 128 for k in kids)
    assert moved["NN"] >= 0.5 * moved["TN"] > 0, moved


def test_mutation_repairs_into_validity_and_respects_axes(templates: dict[str, Template]) -> None:
    # SWZ mutations from PAD=8 break "swizzle and padding are alternatives" unless PAD is repaired to 0
    op = KnobMutation(axes=("swizzle",), max_repair=1)
    proposals = op.propose([_parent(templates)], SHAPE, random.Random(5), 2, OperatorContext((), templates))
    assert all(p.ok for p in proposals), [p.reason for p in proposals]
    for p in proposals:
        assert p.candidate.knobs["SWZ"] != "none" and p.candidate.knobs["PAD"] == 0
    strict = KnobMutation(axes=("swizzle",), max_repair=0, max_attempts=20)
    fails = strict.propose([_parent(templates)], SHAPE, random.Random(5), 2, OperatorContext((), templates))
    assert len(fails) == 2 and not any(p.ok for p in fails)  # every requested slot is a counted failure
    assert "swizzle and padding are alternatives" in fails[0].reason


def test_mutation_repairs_a_parent_from_another_shape(templates: dict[str, Template]) -> None:
    parent = _parent(templates, SPLIT_K=8)  # 8 * 32 <= 512 at SHAPE, but 8 * 16 > 80 at SMALL
    assert templates["synth"].check(parent.knobs, SMALL)
    proposals = get_operator("knob_mutation").propose([parent], SMALL, random.Random(0), 5, OperatorContext((), templates))
    assert all(p.ok for p in proposals), [p.reason for p in proposals]
    for p in proposals:
        assert templates["synth"].check(p.candidate.knobs, SMALL) == []
        assert "SPLIT_K" in p.candidate.meta["repaired_parent"] and p.candidate.parents == (parent.id,)


def test_mutation_never_repeats_a_known_knob_set(templates: dict[str, Template]) -> None:
    op = KnobMutation(axes=("epilogue",), max_repair=0)  # one bool: exactly one neighbour exists
    parent = _parent(templates)
    first = op.propose([parent], SHAPE, random.Random(0), 3, OperatorContext((), templates))
    assert [p.ok for p in first] == [True, False, False] and "already known" in first[1].reason
    child = first[0].candidate
    again = op.propose([parent], SHAPE, random.Random(1), 1, OperatorContext([(child, evaluation(child, SHAPE, 1.1))], templates))
    assert not again[0].ok


# -- knob crossover --------------------------------------------------------------------------------
def test_crossover_children_take_every_knob_from_a_parent(templates: dict[str, Template]) -> None:
    a = _parent(templates)
    b = _parent(templates, BM=64, BN=256, WM=32, STAGES=4, UNROLL=4, PAD=0, SWZ="xor4", EPI_SMEM=True, BK=16)
    for mode in ("uniform", "axis"):
        op = KnobCrossover(mode=mode)
        proposals = op.propose([a, b], SHAPE, random.Random(2), 30, OperatorContext((), templates))
        assert all(p.ok for p in proposals), [p.reason for p in proposals if not p.ok]
        # five axes differ: at most 2**5 - 2 = 30 axis children, fewer valid; then mutation takes over
        kids = [p.candidate for p in proposals if "mode" in p.candidate.meta]
        assert len(kids) >= (25 if mode == "uniform" else 15), len(kids)
        for p in proposals:
            if "fallback" in p.candidate.meta:
                assert "already known" in p.candidate.meta["fallback"] and p.candidate.parents == (a.id,)
        for kid in kids:
            assert kid.parents == (a.id, b.id)
            for k, v in kid.knobs.items():
                assert v in (a.knobs[k], b.knobs[k]), (k, v)
            assert dict(kid.knobs) not in (dict(a.knobs), dict(b.knobs))
            if mode == "axis" and kid.meta["mode"] == "axis":
                loops = {kid.meta["from"][k] for k in ("STAGES", "UNROLL")}
                assert len(loops) == 1, kid.meta  # whole axes travel together (no constraint ties loops)


def test_crossover_of_converged_parents_falls_back_to_mutation(templates: dict[str, Template]) -> None:
    a = _parent(templates)
    b = _parent(templates, STAGES=4, UNROLL=2)  # two children only: (STAGES=4, UNROLL=1) and (3, 2)
    kids = [templates["synth"].candidate({**a.knobs, **change}, SHAPE) for change in ({"STAGES": 4}, {"UNROLL": 2})]
    context = OperatorContext([(k, evaluation(k, SHAPE, 0.5)) for k in kids], templates)
    proposals = KnobCrossover(max_attempts=16).propose([a, b], SHAPE, random.Random(0), 3, context)
    assert all(p.ok for p in proposals), [p.reason for p in proposals]
    for p in proposals:
        assert "already known" in p.candidate.meta["fallback"] and len(p.candidate.parents) == 1
        assert p.candidate.id not in context.known_ids


def test_crossover_of_two_templates_falls_back_or_fails_with_the_reason(templates: dict[str, Template]) -> None:
    context = OperatorContext((), templates)
    weak = ParentView(templates["other"].candidate({"TILE": 32}, SHAPE), None)
    strong = _parent(templates)
    proposals = KnobCrossover().propose([weak, strong], SHAPE, random.Random(0), 3, context)
    assert all(p.ok for p in proposals)
    for p in proposals:
        assert p.candidate.template == "synth" and p.candidate.parents == (strong.id,)
        assert "different templates" in p.candidate.meta["fallback"]
    [fail] = KnobCrossover(fallback="fail").propose([weak, strong], SHAPE, random.Random(0), 3, context)
    assert not fail.ok and "different templates" in fail.reason and set(fail.parents) == {weak.id, strong.id}


@pytest.mark.parametrize("name", [n for n in available_operators() if not n.startswith("llm")])
def test_conformance_obeys_the_target_arch(name: str, templates: dict[str, Template]) -> None:
    """On an sm_80 target, sm80_mma's ARCH constraint (shared memory under the 163 KiB cap) holds
    for every proposal, though the operators never pass an arch themselves: the context binds it.
    (The LLM operators check knob edits through the same bound template, see the next test; with
    the real model a proposal takes minutes on a loaded 2-core CPU.)"""
    t = templates["sm80_mma"]
    shape = Shape.parse("4096x4096x4096")
    big = [k for k in t.sample(random.Random(5), shape, 400, 90) if t.check(k, shape, 80)]
    assert len(big) >= 4, "need parents that are valid on sm_90 only"
    cands = [t.candidate(k, shape) for k in big[:6]]
    hist = [(c, evaluation(c, shape, 1.0 - 0.1 * i)) for i, c in enumerate(cands)]
    context = OperatorContext(hist, {t.name: t}, arch=80)
    proposals = run(name, [ParentView(c, e) for c, e in hist][:2], context, shape, seed=11, n=6)
    made = [p.candidate for p in proposals if p.ok]
    assert made or all(p.reason for p in proposals)
    for c in made:
        assert t.check(c.knobs, shape, 80) == [], (name, c.knobs)


def test_context_binds_templates_to_its_arch(templates: dict[str, Template]) -> None:
    t = templates["sm80_mma"]
    shape = Shape.parse("4096x4096x4096")
    knobs = next(k for k in t.sample(random.Random(5), shape, 400, 90) if t.check(k, shape, 80))
    bound = OperatorContext((), {t.name: t}, arch="sm_80").templates[t.name]
    assert t.check(knobs, shape) == [] and bound.check(knobs, shape) != []  # the grammar's and parser's call
    assert all(bound.check(k, shape) == [] for k in bound.sample(random.Random(1), shape, 50))
    assert OperatorContext((), {t.name: t}, arch=90).templates[t.name].check(knobs, shape) == []
