"""The context the LLM operators give a model (issue 25): the shape's class from the data file's
rules, the roofline line, the parent's roofline fraction and ptxas figures, and the strongest
kernels with their knob changes against the parent, as rendered into the real prompts."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from operators import OperatorContext, ParentView, get_operator
from operators.llm._context import describe_roofline, knob_diff, load_context, rank_siblings, shape_class
from populations import Evaluation, Shape, Status, load_template

from test_llm_operator import KERNEL, SHAPE, TOML, measured


@pytest.fixture(scope="module")
def mini(tmp_path_factory: pytest.TempPathFactory):
    folder: Path = tmp_path_factory.mktemp("ctx") / "mini"
    folder.mkdir()
    (folder / "template.toml").write_text(TOML)
    (folder / "kernel.cu").write_text(KERNEL)
    return load_template(folder)


@pytest.mark.parametrize("shape, name", [
    ("1x4096x4096", "decode"), ("16x896x4864", "decode"), ("64x4096x4096", "skinny"),
    ("4096x64x4096", "skinny"), ("512x896x4864", "mid"), ("4096x4096x4096", "large"),
    ("8x2304x770", "misaligned"), ("2048x4095x4096", "misaligned")])
def test_shape_classes_follow_the_data_rules(shape: str, name: str) -> None:
    assert shape_class(Shape.parse(shape)).name == name
    assert {c.name for c in load_context().classes} == {"decode", "skinny", "mid", "large", "misaligned"}


def test_roofline_names_the_bound() -> None:
    assert "memory-bound" in describe_roofline(Shape(1, 4096, 4096))
    big = describe_roofline(Shape(8192, 8192, 8192))
    assert "compute-bound" in big and "Roofline floor 1391.7" in big  # 2*8192^3 / 790e12 s


def test_knob_diff() -> None:
    assert knob_diff({"BM": 128, "SWZ": "none"}, {"BM": 64, "SWZ": "none"}) == "BM 128 -> 64"
    assert knob_diff({"A": 1}, {"A": 1}) == "same knobs"
    assert knob_diff({"EPI": False}, {"EPI": True}) == "EPI false -> true"


def test_the_prompt_carries_class_roofline_ptxas_and_sibling_diffs(mini) -> None:
    parent = mini.candidate({"BM": 64, "STAGES": 3, "SWZ": "xor4"}, SHAPE)
    best = mini.candidate({"BM": 128, "WM": 32}, SHAPE)
    mid = mini.candidate({"BM": 64, "STAGES": 2, "SWZ": "xor4"}, SHAPE)
    flagged = mini.candidate({"BM": 256, "WM": 64}, SHAPE)
    p_ev = replace(measured(parent, 0.8), roofline_frac=0.123)
    hist = [(parent, p_ev), (best, measured(best, 1.25)), (mid, measured(mid, 0.9)),
            (flagged, replace(measured(flagged, 9.0), status=Status.FLAGGED, flags=("below the floor",)))]
    ctx = OperatorContext(hist, {"mini": mini}, arch=90)
    op = get_operator("llm", inspirations=2)
    text = op.messages([ParentView(parent, p_ev)], SHAPE, ctx, mini)[1]["content"]
    assert "Class: mid: " in text and "Roofline floor" in text
    assert "roofline fraction: 0.123" in text
    assert "168 registers, 8 B spill stores, 0 B spill loads, 1024 B static shared memory" in text
    strong = text.split("## Strong kernels")[1].split("## Your answer")[0]
    lines = [ln for ln in strong.splitlines() if ln.startswith("- ")]
    assert len(lines) == 2 and lines[0].startswith(f"- {best.id}: speedup 1.250x")  # fittest first
    assert "differs: BM 64 -> 128, STAGES 3 -> 2, SWZ xor4 -> none" in lines[0]
    assert "differs: STAGES 3 -> 2" in lines[1]
    assert flagged.id not in text  # a flagged kernel is no example
    # the knob space stays in the prompt: every knob with its domain
    assert "BM = 64  (one of 32, 64, 128, 256; tiling)" in text


def test_siblings_of_the_parents_template_come_first(mini) -> None:
    parent = mini.candidate({"BM": 64}, SHAPE)
    same = mini.candidate({"BM": 128, "WM": 32}, SHAPE)
    other = replace(mini.candidate({"BM": 32, "WM": 16}, SHAPE), template="other")
    hist = [(same, measured(same, 1.1)), (other, measured(other, 2.0)),
            (parent, measured(parent, 1.0)), (same, measured(same, 1.2))]
    ranked = rank_siblings(ParentView(parent, hist[2][1]), hist, 2)
    assert [p.id for p in ranked] == [same.id, other.id]  # the template's first; one per candidate
    assert ranked[0].fitness == pytest.approx(1.2)
    assert [p.id for p in rank_siblings(ParentView(other, None), hist, 2)] == [same.id, parent.id]
    assert not rank_siblings(ParentView(parent, None), [(parent, Evaluation(parent.id, SHAPE, Status.INCORRECT))], 3)
