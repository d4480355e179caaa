"""RL over many shapes (issue 25): the split of shapes by model (no test shape's model, and no
test shape, in training), and the improvement reward computed from archive records (gain over
the parent in GPU time, zero for invalid or slower, flagged still penalised), through the
reward table, the dataset export and the GRPO reward source."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from evo.cli import main
from evo.rl import RewardConfig, RewardTable, export_rows
from evo.rl._reward import improvement_of
from evo.rl._split import LayerRow, ShapeSplit, read_layers, split_by_model
from populations import Archive, Evaluation, Shape, Status, TimerResult, load_templates

CSV = """M,N,K,model,layer
1,2304,768,gpt2,qkv
8,2304,768,gpt2,qkv
1,4096,4096,llama,o
1,4096,4096,phi,o
64,3072,3072,phi,o
16,576,576,smol,q
"""
_ROOT = Path(__file__).resolve().parents[1]
REAL = next((p for p in (_ROOT.parent / "shared" / "shapes" / "llm_layers.csv", _ROOT / "shared" / "shapes" / "llm_layers.csv",
                         _ROOT / ".carry_shared" / "llm_layers.csv", _ROOT.parent / ".carry_shared" / "llm_layers.csv",
                         Path("/work/shared/shapes/llm_layers.csv")) if p.is_file()), _ROOT / "absent.csv")


@pytest.fixture
def rows(tmp_path: Path) -> list[LayerRow]:
    p = tmp_path / "layers.csv"
    p.write_text(CSV)
    return read_layers(p)


def test_split_by_model_keeps_test_shapes_out_of_training(rows) -> None:
    grid = [Shape(1, 4096, 4096), Shape(64, 64, 64)]
    split = split_by_model(rows, test_models=["phi"], grid=grid)
    assert split.test_models == ["phi"] and split.train_models == ["gpt2", "llama", "smol"]
    assert set(split.test) == {Shape(1, 4096, 4096), Shape(64, 3072, 3072)}
    # llama's 1x4096x4096 (and the grid's) is phi's too: withheld from training, not leaked
    assert Shape(1, 4096, 4096) not in split.train and Shape(1, 4096, 4096) in split.withheld
    assert Shape(64, 64, 64) in split.train and Shape(16, 576, 576) in split.train
    split.check(rows)
    bad = ShapeSplit(split.train + [Shape(64, 3072, 3072)], split.test, split.train_models, split.test_models)
    with pytest.raises(ValueError):
        bad.check(rows)


def test_seeded_split_is_reproducible_and_refuses_degenerate_ones(rows, tmp_path: Path) -> None:
    a, b = split_by_model(rows, seed=3), split_by_model(rows, seed=3)
    assert a.to_dict() == b.to_dict() and len(a.test_models) == 1  # a third of 4 models, rounded
    a.write(tmp_path / "s.json")
    assert ShapeSplit.read(tmp_path / "s.json").to_dict() == a.to_dict()
    with pytest.raises(ValueError):
        split_by_model(rows, test_models=["gpt2", "llama", "phi", "smol"])
    with pytest.raises(ValueError):
        split_by_model(rows, test_models=["nope"])
    with pytest.raises(ValueError):
        split_by_model([r for r in rows if r.model == "gpt2"])


@pytest.mark.skipif(not REAL.is_file(), reason="../shared/shapes/llm_layers.csv is not here")
def test_the_real_layer_table_splits_cleanly(tmp_path: Path, capsys) -> None:
    assert main(["rl", "split", "--layers", str(REAL), "--out", str(tmp_path / "s.json"), "--grid-size", "64",
                 "--grid-size", "4096"]) == 0
    split = ShapeSplit.read(tmp_path / "s.json")
    rows = read_layers(REAL)
    split.check(rows)
    assert len(split.test_models) == 2 and len(split.train_models) == 4
    assert not set(split.train) & set(split.test)


# -- the improvement reward ------------------------------------------------------------------------
SHAPE = Shape.parse("64x64x1024")


def _ev(cid: str, status: Status, us: float | None = None, flags: tuple[str, ...] = ()) -> Evaluation:
    timers = {"device": TimerResult(us * 1e-6, us * 1e-6, us * 1e-6, 10e-6, 10e-6, 10e-6, 5)} if us else {}
    return Evaluation(cid, SHAPE, status, timers=timers, flags=flags)


def test_improvement_over_the_parent_in_gpu_time() -> None:
    parent = [_ev("p", Status.OK, 10.0)]
    assert improvement_of([_ev("c", Status.OK, 8.0)], parent) == pytest.approx(math.log(10 / 8))
    assert improvement_of([_ev("c", Status.OK, 12.0)], parent) == 0.0          # slower
    assert improvement_of([_ev("c", Status.COMPILE_ERROR)], parent) == 0.0     # invalid
    assert improvement_of([_ev("c", Status.INCORRECT, 1.0)], parent) == 0.0    # wrong, however fast
    assert improvement_of([_ev("c", Status.OK, 8.0)], [_ev("p", Status.TIMEOUT)]) == 0.0  # no parent time
    assert improvement_of([_ev("c", Status.OK, 1.0, flags=("below floor",))], parent) == RewardConfig().flagged
    assert improvement_of([], parent) is None
    assert improvement_of([_ev("c", Status.OK, 1e-6)], parent) == RewardConfig().ceiling  # clipped
    with pytest.raises(ValueError):
        RewardConfig(kind="bogus")


def test_rewards_travel_from_archive_records(tmp_path: Path) -> None:
    """An archive with a parent and three LLM children: the table and the export agree."""
    tiny = load_templates()["tiny"]
    knobs = [dict(k) for k in tiny.sample(__import__("random").Random(0), SHAPE, 4)]
    parent = tiny.candidate(knobs[0], SHAPE)
    kids = [tiny.candidate(k, SHAPE, parents=(parent.id,), operator="llm", model="m", prompt="[user]\nq",
                           completion=f"a{i}") for i, k in enumerate(knobs[1:])]
    with Archive(tmp_path / "a", "w") as ar:
        for c in [parent, *kids]:
            ar.add(c)
        ar.add(_ev(parent.id, Status.OK, 10.0))
        ar.add(_ev(kids[0].id, Status.OK, 5.0))
        ar.add(_ev(kids[1].id, Status.OK, 20.0))
        ar.add(_ev(kids[2].id, Status.RUNTIME_ERROR))
        ar.commit()
    cfg = RewardConfig(kind="improvement")
    with Archive(tmp_path / "a", "r") as ar:
        table = RewardTable(cfg).add_archive(ar)
        rows = {r["candidate"]: r["reward"] for r in export_rows([ar], config=cfg)}
        speed = {r["candidate"]: r["reward"] for r in export_rows([ar])}
    want = {kids[0].id: math.log(2.0), kids[1].id: 0.0, kids[2].id: 0.0}
    for cid, r in want.items():
        assert table.get(SHAPE, cid) == pytest.approx(r)
        assert rows[cid] == pytest.approx(r)
    assert speed[kids[0].id] == pytest.approx(math.log(2.0))  # 10 us baseline / 5 us: the old reward differs
    assert speed[kids[2].id] < 0
    assert table.get(SHAPE, parent.id) == 0.0  # a seed has no parent: nothing to improve on
    # a fresh sample of a group is scored against the group's parent
    t2 = RewardTable(cfg)
    t2.add(_ev(parent.id, Status.OK, 10.0))
    t2.add(_ev("fresh", Status.OK, 4.0))
    assert t2.get(SHAPE, "fresh") == 0.0
    t2.set_parent(SHAPE, "fresh", parent.id)
    assert t2.get(SHAPE, "fresh") == pytest.approx(math.log(2.5))
