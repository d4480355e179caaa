"""bench/ranker_offline.py on a real archive of several shapes (the rl learning check's synthetic
archives, a named test double for the GPU's measurements, copied into one archive): the tabular
ranker, fitted on the training shapes only, orders the held-out shapes' children better than the
random draws do (one knob value is clearly best on every shape), and bad input is one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_script import load, refuses
from evo.rl import synthetic_archive
from operators import cost_models
from populations import Archive, Shape, load_templates

PARENT = {"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "SPLIT_K": 1}


@pytest.fixture(scope="module")
def archive(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tiny = load_templates()["tiny"]
    root = tmp_path_factory.mktemp("ranker")
    out = root / "multi"
    with Archive(out, mode="w") as dst:
        for i, s in enumerate(["64x64x1024", "128x64x512", "64x128x2048", "256x128x1024"]):
            src = synthetic_archive(root / f"a{i}", tiny, Shape.parse(s), "WARPS", 8, parent_knobs=PARENT, seed=i)
            with Archive(src, mode="r") as a:
                for shape in a.shapes():
                    evs: dict = {}
                    for ev in a.evaluations(shape):
                        evs.setdefault(ev.candidate_id, []).append(ev)
                    for c in a.candidates(shape):
                        dst.record(c, evs.get(c.id, []))
        dst.commit()
    return out


@pytest.mark.skipif("tabular" not in cost_models(), reason="the ranker extra (scikit-learn) is not installed")
def test_the_tabular_ranker_beats_random_draws_on_held_out_shapes(archive: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    assert load("ranker_offline").main(["--archive", str(archive), "--no-llm", "--holdout", "0.5", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["held_out_groups"] == 2 and r["train_groups"] == 2 and len(r["held_out_shapes"]) == 2
    rand, tab = r["rankers"]["random"], r["rankers"]["tabular"]
    assert abs(rand["pairwise_accuracy"] - 0.5) < 0.03
    assert tab["pairs"] == rand["pairs"] > 1000 and tab["pairwise_accuracy"] > rand["pairwise_accuracy"] + 0.05


def test_bad_input_is_one_line(tmp_path: Path, archive: Path, capsys: pytest.CaptureFixture) -> None:
    refuses("ranker_offline", ["--archive", str(tmp_path / "none")], capsys)
    refuses("ranker_offline", ["--archive", str(archive), "--holdout", "1.5"], capsys)
