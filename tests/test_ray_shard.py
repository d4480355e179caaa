"""Sharding shapes across GPU actors by headroom (issue 23): the arithmetic, then RayPool on a
real local Ray cluster (two CPUs, two *logical* GPUs) and the engine driving it.

Real parts: Ray tasks and actors, NVRTC compiles, the WorkerSupervisor and its spawned worker
processes inside the actors, the engine, its allocation and its archive. Test doubles: the GPU
handler inside the worker (``fake_gpu_worker``), slowed down per job and, in
:class:`HeadroomFakeHandler`, answering with device times at a chosen fraction of each shape's
attainable time, so that the engine's headroom weights differ between shapes.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from evaluators.pools._shard import shape_loads, shard, slot_loads


# -- the arithmetic (no Ray) -----------------------------------------------------------------
def test_shard_evens_the_loads_heaviest_first() -> None:
    loads = {"a": 1.0, "b": 0.5, "c": 0.5}
    got = shard(loads, [0, 1], {})
    assert got["b"] == got["c"] != got["a"]
    assert sorted(slot_loads(got, loads, [0, 1]).values()) == [1.0, 1.0]


def test_shard_keeps_a_shape_where_it_is_while_that_stays_even() -> None:
    loads = {f"s{i}": 1.0 for i in range(6)}
    current = {"s0": 1, "s1": 1, "s2": 1, "s3": 0, "s4": 0, "s5": 0}
    assert shard(loads, [0, 1], current) == current  # already even: nothing moves
    lopsided = {k: 1 for k in loads}  # all on slot 1: half of them must move, the other half stays
    got = shard(loads, [0, 1], lopsided)
    assert sorted(slot_loads(got, loads, [0, 1]).values()) == [3.0, 3.0]
    assert sum(1 for k in loads if got[k] == 1) == 3


def test_a_shape_heavier_than_a_share_gets_a_slot_of_its_own() -> None:
    loads = {"big": 5.0, "x": 1.0, "y": 1.0, "z": 1.0}
    got = shard(loads, [0, 1, 2], {"big": 2, "x": 2})
    assert got["big"] == 2 and all(got[k] != 2 for k in "xyz")


def test_when_a_slot_leaves_its_shapes_spread_over_the_rest() -> None:
    loads = {f"s{i}": 1.0 for i in range(6)}
    before = shard(loads, [0, 1, 2], {})
    after = shard(loads, [0, 2], before)
    assert set(after.values()) == {0, 2}
    assert all(after[k] == before[k] for k in loads if before[k] != 1)  # the others keep their shapes
    assert sorted(slot_loads(after, loads, [0, 2]).values()) == [3.0, 3.0]


def test_loads_are_weight_times_job_seconds_with_the_mean_for_an_untimed_shape() -> None:
    loads = shape_loads({"a": 1.0, "b": 0.5, "c": 1.0, "d": -1.0}, {"a": 2.0, "b": 4.0})
    assert loads == {"a": 2.0, "b": 2.0, "c": 3.0, "d": 0.0}
    assert shape_loads({"a": 1.0}, {}) == {"a": 1.0}
    assert shard({}, [0, 1], {}) == {} and shard({"a": 1.0}, [], {}) == {}


# -- RayPool on a real local cluster ------------------------------------------------------------
ray = pytest.importorskip("ray", reason="the Ray sharding tests need ray (pip install -e '.[dev]' installs it)")
pytest.importorskip("evaluators.compile._compile")

from fake_gpu_worker import FakeGpuHandler  # noqa: E402
from populations import Archive, Shape, Status, attainable_time, load_templates  # noqa: E402
from ray_clusters import one_node  # noqa: E402

A, B, C = (Shape.parse(s) for s in ("64x64x64", "128x64x32", "32x32x4096"))
DEADLINES = {"startup": 60.0, "probe": 20.0, "load": 10.0, "correctness": 10.0, "timing": 10.0}
HEADROOM = "test_ray_shard:make_headroom_handler"


class HeadroomFakeHandler(FakeGpuHandler):
    """Test double: each job takes ``delay_s``; an ok shape answers with a device timer whose
    median is the shape's attainable time (H200 figures) divided by ``frac[shape]`` (default
    0.1: far from its roofline), against a baseline 1.5x slower."""

    def handle(self, kind, job, phase):  # type: ignore[no-untyped-def]
        out = super().handle(kind, job, phase)
        if kind != "job":
            return out
        time.sleep(float(self.options.get("delay_s", 0.0)))
        for r in out.get("shapes", []):
            t = attainable_time(Shape.parse(r["shape"])) / float(self.options.get("frac", {}).get(r["shape"], 0.1))
            r["timers"] = {"device": {"median": t, "lo": t, "hi": t, "baseline_median": 1.5 * t,
                                      "baseline_lo": 1.5 * t, "baseline_hi": 1.5 * t, "samples": 9}}
        return out


def make_headroom_handler(options: dict) -> HeadroomFakeHandler:
    return HeadroomFakeHandler(options)


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (two CPUs, two logical GPUs)."""
    with one_node(ray) as r:
        yield r


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("cubins")


def _pool(tmp_path: Path, cache: Path, **options):
    from evaluators import RayPool

    return RayPool(gpus=2, compile_workers=2, target=HEADROOM, worker_options=options, deadlines=DEADLINES,
                   log_dir=str(tmp_path / "logs"), cache_dir=str(cache), arch="sm_90a")


def _naive(shape: Shape, n: int) -> list:
    from evaluators.run._builtin_kernels import naive_candidate

    return [naive_candidate((shape,), tile=t) for t in (1, 2, 4, 8, 16, 32)[:n]]


def test_shapes_are_sharded_by_weight_and_resharded_when_the_weights_move(cluster, cache, tmp_path):
    with _pool(tmp_path, cache, delay_s=0.3) as pool:
        assert pool.wait_ready(timeout=120)
        pool.set_shape_weights({A: 1.0, B: 0.5, C: 0.5})
        first = pool.affinity()
        # the work the engine would send for those weights: twice as many of A
        evals = pool.evaluate(_naive(A, 4) + _naive(B, 2) + _naive(C, 2))
        ran = {(str(e.shape), e.provenance["ray_slot"]) for e in evals}
        busy = dict(pool.stats.gpu_busy_s)
        pool.set_shape_weights({A: 0.0, B: 1.0, C: 1.0})  # A saturated: it yields, B and C split
        second = pool.affinity()
        loads = pool.shard_loads()
    assert first[str(B)] == first[str(C)] != first[str(A)], first
    assert all(e.status is Status.OK for e in evals)
    assert sorted(busy) == [0, 1] and min(busy.values()) > 0.4 * max(busy.values()), busy  # both actors worked
    assert {slot for shape, slot in ran if shape == str(A)} >= {first[str(A)]}
    assert second[str(B)] != second[str(C)], second
    # sticky: A, yielding, keeps its actor (and its buffers); of B and C, which shared an actor,
    # the one measured heavier keeps it (which one that is depends on the measured job seconds;
    # the rule itself is unit-tested on shard() above)
    assert second[str(A)] == first[str(A)], (first, second)
    assert max(loads.values()) == pytest.approx(min(loads.values()), rel=0.5), loads


def test_an_idle_actor_steals_so_a_one_shape_burst_uses_both(cluster, cache, tmp_path):
    with _pool(tmp_path, cache, delay_s=0.4) as pool:
        assert pool.wait_ready(timeout=120)
        pool.set_shape_weights({A: 1.0, B: 1.0})
        evals = pool.evaluate(_naive(A, 6))  # all of one shape: its shard alone would idle the other actor
        stolen = pool.stats.stolen
    assert all(e.status is Status.OK for e in evals)
    assert {e.provenance["ray_slot"] for e in evals} == {0, 1} and stolen >= 1


def test_the_engine_sends_its_headroom_and_the_actors_share_the_shapes_that_have_it(cluster, cache, tmp_path):
    """A at 0.95 of its attainable time (saturated: it yields after its first results), B and C
    far from theirs: the engine's weights reach the pool, B and C end up on different actors,
    and both actors stay busy."""
    from evo.cli._orchestrate import expand_operators, make_operators
    from evo.search._config import merge
    from evo.search._engine import Engine
    from evo.search._progress import EVENTS_FILE, EventLog

    shapes = [A, B, C]
    cfg = merge({}, {"shapes": [str(s) for s in shapes], "archive": str(tmp_path / "a"), "operators": "knob",
                     "progress": "none", "max_evals": 18, "pool": {"compile_workers": 2}})
    cfg.operators = expand_operators(cfg.operators)
    sent: list[dict] = []
    with _pool(tmp_path, cache, delay_s=0.25, frac={str(A): 0.95}) as pool, Archive(tmp_path / "a", "w") as archive:
        real = pool.set_shape_weights

        def spy(weights):  # the pool's own method, called through: records what the engine sends
            sent.append({str(s): w for s, w in weights.items()})
            real(weights)

        pool.set_shape_weights = spy  # type: ignore[method-assign]
        events = EventLog(tmp_path / "a" / EVENTS_FILE)
        engine = Engine(cfg, archive, pool, make_operators(cfg.operators), {"tiny": load_templates()["tiny"]},
                        events=events)
        result = engine.run()
        events.close()
        affinity = pool.affinity()
        busy = dict(pool.stats.gpu_busy_s)
    assert result.evaluations == 18 and result.lost == 0
    assert sent and sent[0] == {str(s): 1.0 for s in shapes}  # nothing measured yet: all have headroom
    assert sent[-1][str(A)] == 0.0 and sent[-1][str(B)] > 0.5 and sent[-1][str(C)] > 0.5
    assert affinity[str(B)] != affinity[str(C)], affinity
    assert sorted(busy) == [0, 1] and min(busy.values()) > 0.3 * max(busy.values()), busy
    with Archive(tmp_path / "a", "r") as ar:
        per_shape = {str(s): len(ar.evaluations(s)) for s in shapes}
    assert per_shape[str(A)] < min(per_shape[str(B)], per_shape[str(C)]), per_shape  # the budget went to headroom
