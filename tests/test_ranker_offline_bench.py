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


def _saved(seed: int, gains: list, scores: dict) -> dict:
    """A saved result of the script's shape (--json), made here: held-out gains and scores."""
    return {"archive": "A", "seed": seed, "holdout": 0.34, "scores": scores,
            "groups": [{"key": f"g{i}", "shape": "8x64x64:TN:f32", "gains": g} for i, g in enumerate(gains)]}


def test_paired_differences_count_the_same_pairs_and_pool_splits(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--compare: one ranker that orders every pair right against one that orders none gives +1.0 with
    a degenerate interval; a failed child (None) ranks lowest; two splits pool their pairs; the same
    split twice is refused."""
    gains = [[0.1, 0.0, None], [0.3, -0.2]]            # 3 + 1 ordered pairs
    right = [[3.0, 2.0, 1.0], [1.0, 0.0]]
    wrong = [[1.0, 2.0, 3.0], [0.0, 1.0]]
    tied = [[0.0, 0.0, 0.0], [0.0, 0.0]]
    mod = load("ranker_offline")
    a = tmp_path / "s0.json"
    a.write_text(json.dumps(_saved(0, gains, {"llm ranked": right, "tabular": wrong, "llm base": tied})))
    b = tmp_path / "s1.json"
    b.write_text(json.dumps(_saved(1, gains[:1], {"llm ranked": tied, "tabular": wrong, "llm base": tied})))
    assert mod.main(["--compare", str(a), str(b)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| llm")]
    by = {(ln.split("|")[1].strip(), ln.split("|")[2].strip()): ln for ln in lines}
    assert "| 4 | +1.0000 | +1.0000 to +1.0000 |" in by[("llm ranked - tabular", "0")]
    assert "| 3 | +0.5000 | +0.5000 to +0.5000 |" in by[("llm ranked - tabular", "1")]   # ties count half
    assert "| 7 | +0.7857 |" in by[("llm ranked - tabular", "pooled (0,1)")]            # (4 + 1.5) / 7
    assert "| 4 | +0.5000 | +0.5000 to +0.5000 |" in by[("llm ranked - llm base", "0")]
    held = mod._groups_from_json(_saved(0, gains, {}))
    d = mod.paired_difference([(held, wrong, right)], seed=3)
    assert d == {"difference": -1.0, "ci95": [-1.0, -1.0], "pairs": 4}
    refuses("ranker_offline", ["--compare", str(a), str(a)], capsys)
    refuses("ranker_offline", ["--compare", str(tmp_path / "none.json")], capsys)
    refuses("ranker_offline", [], capsys)


@pytest.mark.skipif("tabular" not in cost_models(), reason="the ranker extra (scikit-learn) is not installed")
def test_saved_llm_rows_are_reused_only_on_the_same_split(archive: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture) -> None:
    """--reuse-llm: the LLM rows of a saved result join a new run of the same split (its tabular
    row recomputed) with their paired differences; a result of another split is refused."""
    mod = load("ranker_offline")
    first = tmp_path / "first.json"
    assert mod.main(["--archive", str(archive), "--no-llm", "--holdout", "0.5", "--json", str(first)]) == 0
    saved = json.loads(first.read_text())
    saved["scores"]["llm base"] = [[0.0] * len(g["gains"]) for g in saved["groups"]]   # ties: accuracy 0.5
    saved["llm_steps"] = 0
    first.write_text(json.dumps(saved))
    again = tmp_path / "again.json"
    assert mod.main(["--archive", str(archive), "--no-llm", "--holdout", "0.5", "--reuse-llm", str(first),
                     "--json", str(again)]) == 0
    r = json.loads(again.read_text())
    assert r["rankers"]["llm base"]["pairwise_accuracy"] == 0.5 and r["llm_from"] == str(first)
    assert r["differences"]["llm base - tabular"]["difference"] == pytest.approx(
        0.5 - r["rankers"]["tabular"]["pairwise_accuracy"], abs=1e-3)
    refuses("ranker_offline", ["--archive", str(archive), "--no-llm", "--holdout", "0.5", "--seed", "1",
                               "--reuse-llm", str(first)], capsys)
