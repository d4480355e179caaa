"""bench/ray_scaling.py's issue-23 legs on this CPU machine (slow: several minutes): a fault leg
killing the only GPU actor, and a two-node leg (two real ``ray start`` raylets on this host,
one logical GPU each) whose second node is killed and started again. The GPU handler is the
test double of tests/test_ray_pool.py; the figures mean nothing here, the checks do: the legs
run, nothing committed is lost, every candidate is evaluated, the replacement actors come
back, and the figures are written.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="the Ray benchmark legs need ray")
pytest.importorskip("evaluators.compile._compile")

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("ray_scaling", ROOT / "bench" / "ray_scaling.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_leg_names_and_the_issue23_shape_list() -> None:
    bench = _bench()
    assert [bench.leg_spec(n) for n in ("ray8", "nodes4", "fault1", "nodefault2")] == \
        [("ray", 8), ("nodes", 4), ("fault", 1), ("nodefault", 2)]
    for bad in ("nodes1", "gpu2", "ray0", "ray"):
        with pytest.raises(ValueError):
            bench.leg_spec(bad)
    try:
        shapes = bench.issue23_shapes()
    except FileNotFoundError:
        pytest.skip("no shared/shapes/llm_layers.csv beside this checkout")
    assert len(shapes) == len(set(shapes)) and 240 <= len(shapes) <= 243  # 143 + 100, one shape in both


@pytest.mark.slow
def test_fault_and_two_node_legs_lose_nothing_and_get_their_actors_back(tmp_path, capfd) -> None:
    code = _bench().main(["--seconds", "50", "--warmup", "4", "--legs", "fault1,nodefault2",
                          "--shapes", "64x64x64,128x64x32", "--compile-workers", "2", "--num-gpus", "2",
                          "--kill-every", "20", "--node-down", "3", "--recovery-window", "6",
                          "--worker-target", "test_ray_pool:make_slow_handler",
                          "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    captured = capfd.readouterr()  # the legs' processes write to the inherited stdout and stderr
    out = captured.out
    assert code == 0, out[-3000:] + "\n--- stderr ---\n" + captured.err[-4000:]
    legs = {r["leg"]: r for r in json.loads((tmp_path / "out" / "ray_scaling.json").read_text())["legs"]}
    assert set(legs) == {"fault1", "nodefault2"}
    for row in legs.values():
        faults = row["faults"]
        assert len(faults["faults"]) >= 2 and not faults["errors"], row
        assert faults["committed_lost"] == 0, row
        assert faults["unevaluated"] <= row["lost_in_flight"], row  # only what the engine abandoned at its end
        assert all(f["replaced_s"] is not None for f in faults["faults"][:-1]), row  # each came back (not yet: the last)
        assert row["evaluations"] > 0 and row["actors_replaced"] >= 2, row
    assert "(2 node(s))" in out
