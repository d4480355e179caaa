"""``evo rl export --pairs`` (evo.rl._pairs): every measured parent-child pair of every operator,
with its gain, and a prompt rebuilt only from the history that existed before the child.

The archive is real (written and read through populations.Archive), the template and the
shape are real; the times are set by hand so that the order of creations and evaluations is
known: a sibling measured before the child, one created before but measured after it, and one
made after it with a much better speedup. None of the later two may reach the child's prompt.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest

from evo.cli import main
from evo.rl import export_pairs, read_jsonl
from populations import Archive, Candidate, Evaluation, Shape, Status, TimerResult, load_templates

SHAPE = Shape.parse("512x896x4864")


def measured(cand: Candidate, speedup: float, at: float) -> Evaluation:
    t = TimerResult(1e-5 / speedup, 1e-5 / speedup, 1e-5 / speedup, 1e-5, 1e-5, 1e-5, 10)
    return Evaluation(cand.id, SHAPE, Status.OK, timers={"device": t}, arch="sm_90a", created=at)


@pytest.fixture(scope="module")
def family() -> dict[str, Candidate]:
    """A parent and four children of it (knob edits), each made by a named operator at a set time."""
    template = load_templates()["sm90_wgmma"].for_arch(90)
    base = template.heuristic(SHAPE, 90)[0]
    parent = replace(template.candidate(base, SHAPE), created=100.0)
    edits = {"sibling": {"STAGES": 3}, "child": {"STAGES": 5}, "pending": {"GROUP": 16}, "late": {"STAGES": 6}}
    made = {"sibling": 150.0, "child": 200.0, "pending": 180.0, "late": 300.0}
    out = {"parent": parent}
    for name, edit in edits.items():
        knobs = {**base, **edit}
        assert template.check(knobs, SHAPE) == [], (name, template.check(knobs, SHAPE))
        out[name] = replace(template.candidate(knobs, SHAPE, operator="knob_mutation" if name != "late" else "ranked",
                                               parents=(parent.id,)), created=made[name])
    return out


def write(folder: Path, family: dict[str, Candidate], names: list[str]) -> Path:
    evaluated = {"parent": (1.0, 101.0), "sibling": (0.9, 160.0), "child": (1.2, 210.0), "pending": (2.5, 250.0),
                 "late": (3.0, 301.0)}
    with Archive(folder, mode="w") as archive:
        for name in names:
            speedup, at = evaluated[name]
            archive.record(family[name], [measured(family[name], speedup, at)])
        archive.commit()
    return folder


def rows_by_candidate(folder: Path) -> dict[str, dict]:
    with Archive(folder, mode="r") as archive:
        rows, _ = export_pairs([archive])
    return {r["candidate"]: r for r in rows}


def test_a_pairs_prompt_sees_only_the_history_before_the_child(family, tmp_path: Path) -> None:
    early = rows_by_candidate(write(tmp_path / "early", family, ["parent", "sibling", "child"]))
    full = rows_by_candidate(write(tmp_path / "full", family, ["parent", "sibling", "child", "pending", "late"]))
    child, late = family["child"].id, family["late"].id
    assert full[child]["prompt"] == early[child]["prompt"]  # later records change nothing in it
    assert full[child]["history"] == 2  # the parent's and the sibling's evaluations, nothing after 200
    assert full[late]["history"] == 4 and full[late]["prompt"] != full[child]["prompt"]  # history does matter
    text = " ".join(m["content"] for m in full[child]["prompt"])
    assert "2.5" not in text and "3.0x" not in text and "3.00" not in text  # no later speedup leaks
    assert full[child]["gain"] == pytest.approx(1.2) and full[child]["log_gain"] == pytest.approx(math.log(1.2))
    assert full[family["sibling"].id]["reward"] == 0.0  # slower than its parent: no gain
    assert full[child]["completion"][0]["content"] == '{"STAGES": 5}'
    assert {r["operator"] for r in full.values()} == {"knob_mutation", "ranked"}  # every operator, not only LLMs


def test_rl_export_pairs_cli(family, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = write(tmp_path / "a", family, ["parent", "sibling", "child", "pending", "late"])
    out = tmp_path / "pairs.jsonl"
    assert main(["rl", "export", str(folder), "--out", str(out), "--pairs"]) == 0
    rows = read_jsonl(out)
    assert len(rows) == 4 and all({"prompt", "completion", "reward", "gain", "history"} <= set(r) for r in rows)
    text = capsys.readouterr().out
    assert "4 pairs" in text and "left out 1: no parent" in text  # the parent itself: a seed
    assert main(["rl", "export", str(folder), "--out", str(out), "--pairs", "--last", "3"]) == 2
    assert "do not apply" in capsys.readouterr().err
