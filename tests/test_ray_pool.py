"""RayPool on a real local Ray cluster (``ray.init(num_cpus=2, num_gpus=2)``: two CPUs, two
*logical* GPUs, since this machine has none).

Real parts: Ray tasks and actors, NVRTC compiles of the ``tiny`` template, the WorkerSupervisor
and its spawned worker processes inside the actors, the engine and its archive. The test double
is the GPU handler inside the worker (``fake_gpu_worker``, the GPU being a boundary we cannot
cross here), slowed down by :class:`SlowFakeHandler` so that an actor can be killed while it
holds a candidate.
"""
from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray pool tests need ray (pip install -e '.[dev]' installs it)")
pytest.importorskip("evaluators.compile._compile")

from fake_gpu_worker import FakeGpuHandler  # noqa: E402
from populations import Archive, Shape, Status, load_templates  # noqa: E402
from ray_clusters import wait_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
S1, S2, S4 = (Shape.parse(s) for s in ("64x64x64", "128x64x32", "32x32x4096"))
DEADLINES = {"startup": 60.0, "probe": 20.0, "load": 10.0, "correctness": 10.0, "timing": 10.0}
SLOW = "test_ray_pool:make_slow_handler"


class SlowFakeHandler(FakeGpuHandler):
    """Test double: the fake GPU handler, each job taking ``options['delay_s']`` seconds."""

    def handle(self, kind, job, phase):  # type: ignore[no-untyped-def]
        if kind == "job":
            time.sleep(float(self.options.get("delay_s", 0.0)))
        return super().handle(kind, job, phase)


def make_slow_handler(options: dict) -> SlowFakeHandler:
    return SlowFakeHandler(options)


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    """One cubin cache for the module: the tests after the first still compile as Ray tasks,
    but mostly hit the cache (the first test proves the real compiles)."""
    return tmp_path_factory.mktemp("cubins")


@pytest.fixture(scope="module")
def cluster():
    """One local cluster for the module (starting Ray costs ~5-10 s); workers import this
    checkout and this folder (the worker handler above lives here)."""
    if ray.is_initialized():
        ray.shutdown()
    path = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    # address="local": always a new cluster (without it ray.init joins a live one another run left)
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield ray
    ray.shutdown()


def tiny_candidates(shape: Shape, n: int, seed: int = 0) -> list:
    """``n`` distinct candidates of the real ``tiny`` template for ``shape``."""
    tmpl = load_templates()["tiny"]
    out, seen = [], set()
    for knobs in tmpl.sample(random.Random(seed), shape, 8 * n):
        cand = tmpl.candidate(knobs, shape, False)
        if cand.id not in seen:
            seen.add(cand.id)
            out.append(cand)
        if len(out) == n:
            return out
    raise AssertionError(f"the tiny template gave only {len(out)} distinct candidates for {shape}")


def make_pool(tmp_path: Path, cache: Path, gpus: int = 2, delay_s: float = 0.0, **kw):
    from evaluators import RayPool

    return RayPool(gpus=gpus, compile_workers=2, target=SLOW, worker_options={"delay_s": delay_s},
                   deadlines=DEADLINES, log_dir=str(tmp_path / "logs"), cache_dir=str(cache),
                   arch="sm_90a", **kw)


def test_compiles_run_as_ray_tasks_in_parallel_and_shapes_spread_over_actors(cluster, cache, tmp_path):
    # Four distinct sources: generic candidates of the same knobs at two shapes share a source,
    # and the second would then be a cache hit (compile_s ~0) whenever the two compiles do not
    # overlap (seen in a clean-clone CI run).
    first = tiny_candidates(S1, 2)
    sources = {c.source for c in first}
    cands = first + [c for c in tiny_candidates(S2, 6, seed=1) if c.source not in sources][:2]
    assert len({c.source for c in cands}) == 4
    with make_pool(tmp_path, cache) as pool:
        evals = pool.evaluate(cands)
        affinity = pool.affinity()
        stats = pool.stats
    assert [e.status for e in evals] == [Status.OK] * 4, [(e.status, e.message[:200]) for e in evals]
    assert all(e.compile_s > 0.01 and e.kernels for e in evals)  # real NVRTC compiles, ptxas stats kept
    workers = {pid for _, pid in stats.compile_workers}
    assert len(workers) == 2 and os.getpid() not in workers  # two Ray worker processes compiled, concurrently
    assert stats.compiled == 4
    assert sorted(affinity.values()) == [0, 1]  # two shapes, one per actor
    assert {e.provenance["ray_gpu_ids"][0] for e in evals} <= {"0", "1"}
    assert all(e.provenance["ray_attempt"] == 1 for e in evals)


def test_an_actor_killed_mid_batch_is_replaced_and_its_candidate_retried(cluster, cache, tmp_path):
    cands = tiny_candidates(S1, 3) + tiny_candidates(S2, 3)
    with make_pool(tmp_path, cache, delay_s=0.6) as pool:
        futures = [pool.submit(c) for c in cands]
        victim = wait_for(lambda: pool.running().get(0), what="a candidate on actor 0")
        old_actor = pool.actor(0)
        child_pid = int(wait_for(lambda: _read(tmp_path / "logs" / f"ray-{pool.pool_id}-slot0.child"), what="the child's pid file"))
        ray.kill(old_actor, no_restart=True)
        evals = {f.result(timeout=120)[0].candidate_id: f.result()[0] for f in futures}
        stats = pool.stats
        new_actor = wait_for(lambda: pool.actor(0), what="the replacement actor")
        assert new_actor != old_actor
    assert len(evals) == 6 and all(e.status is Status.OK for e in evals.values()), \
        [(e.status, e.message[:200]) for e in evals.values()]
    assert evals[victim].provenance["ray_attempt"] == 2
    assert stats.actors_replaced == 1 and stats.retried == 1
    wait_for(lambda: not _alive(child_pid), timeout=20, what="the killed actor's worker child to be gone")


def test_a_candidate_whose_actor_dies_past_the_retries_is_marked(cluster, cache, tmp_path):
    cands = tiny_candidates(S1, 3)
    with make_pool(tmp_path, cache, gpus=1, delay_s=0.6, max_retries=0) as pool:
        futures = [pool.submit(c) for c in cands]
        victim = wait_for(lambda: pool.running().get(0), what="a candidate on actor 0")
        ray.kill(pool.actor(0), no_restart=True)
        evals = {e.candidate_id: e for f in futures for e in f.result(timeout=120)}
    marked = evals.pop(victim)
    assert marked.status is Status.RUNTIME_ERROR and "actor 0 died" in marked.message
    assert "not retried" in marked.message
    assert all(e.status is Status.OK for e in evals.values())  # the replacement actor took the rest


def test_cancel_all_drops_queued_work_and_keeps_the_running_candidate(cluster, cache, tmp_path):
    from concurrent.futures import CancelledError

    cands = tiny_candidates(S1, 3)
    with make_pool(tmp_path, cache, gpus=1, delay_s=1.0) as pool:
        futures = [pool.submit(c) for c in cands]
        running = wait_for(lambda: pool.running().get(0), what="a candidate on actor 0")
        pool.cancel_all()
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 10  # close() did not evaluate the dropped work
    outcomes = {}
    for cand, fut in zip(cands, futures):
        try:
            outcomes[cand.id] = fut.result(timeout=30)[0].status
        except CancelledError:
            outcomes[cand.id] = "cancelled"
    assert outcomes.pop(running) is Status.OK
    assert set(outcomes.values()) == {"cancelled"}


def test_the_engine_on_the_ray_pool_loses_nothing_when_an_actor_dies(cluster, cache, tmp_path):
    from evo.cli._orchestrate import expand_operators, make_operators
    from evo.search._config import merge
    from evo.search._engine import Engine
    from evo.search._progress import EVENTS_FILE, EventLog

    shapes = [S1, S4]
    cfg = merge({}, {"shapes": [str(s) for s in shapes], "archive": str(tmp_path / "a"), "operators": "knob",
                     "progress": "none", "max_evals": 8, "pool": {"compile_workers": 2}})
    cfg.operators = expand_operators(cfg.operators)
    killed: list[str] = []
    with make_pool(tmp_path, cache, delay_s=0.3) as pool, Archive(tmp_path / "a", "w") as archive:
        def killer() -> None:
            victim = wait_for(lambda: pool.running().get(1), what="a candidate on actor 1")
            killed.append(victim)
            ray.kill(pool.actor(1), no_restart=True)

        thread = threading.Thread(target=killer, daemon=True)
        thread.start()
        events = EventLog(tmp_path / "a" / EVENTS_FILE)
        engine = Engine(cfg, archive, pool, make_operators(cfg.operators), {"tiny": load_templates()["tiny"]},
                        events=events)
        result = engine.run()
        events.close()
        thread.join(timeout=30)
        replaced = pool.stats.actors_replaced
    assert killed and replaced == 1
    assert result.evaluations == 8 and result.lost == 0, result
    with Archive(tmp_path / "a", "r") as ar:
        evaluated = {(e.candidate_id, e.shape) for s in shapes for e in ar.evaluations(s)}
        submitted = {(c.id, s) for s in shapes for c in ar.candidates(s)}
        statuses = [e.status for s in shapes for e in ar.evaluations(s)]
    assert len(evaluated) == 8 and submitted <= evaluated  # every archived candidate has its evaluation
    assert killed[0] in {cid for cid, _ in evaluated}
    assert all(s is Status.OK for s in statuses), statuses


def test_an_actor_whose_worker_cannot_start_leaves_the_work_to_the_others(cluster, cache, tmp_path):
    from evaluators import RayPool

    with RayPool(gpus=2, compile_workers=2, target=SLOW, worker_options={"fail_gpu": "1"}, deadlines=DEADLINES,
                 log_dir=str(tmp_path / "logs"), cache_dir=str(cache), arch="sm_90a") as pool:
        assert pool.wait_ready(timeout=120) is False
        evals = pool.evaluate(tiny_candidates(S1, 2) + tiny_candidates(S2, 2))
    assert [e.status for e in evals] == [Status.OK] * 4, [e.message[:200] for e in evals]
    assert {e.provenance["ray_gpu_ids"][0] for e in evals} == {"0"}


def test_a_cluster_without_enough_gpus_is_a_clear_error(cluster, tmp_path):
    from evaluators import RayPool, WorkerUnavailable

    with pytest.raises(WorkerUnavailable, match="no GPU"):
        RayPool(gpus=None, gpu_per_actor=4.0, target=SLOW, log_dir=str(tmp_path))
    with pytest.raises(WorkerUnavailable, match="offers 2 GPU"):
        RayPool(gpus=3, target=SLOW, log_dir=str(tmp_path))


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_the_scaling_benchmark_runs_both_legs_and_writes_its_figures(tmp_path, capfd):
    """bench/ray_scaling.py end to end, each leg in its own process with its own local cluster
    (two logical GPUs), with the GPU-handler test double (its figures mean nothing here,
    compiles bound them; the lead runs it on H200s). Slow: ~80 s, most of it compiling from a
    cold cache on two busy cores."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("ray_scaling", ROOT / "bench" / "ray_scaling.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    code = bench.main(["--seconds", "6", "--warmup", "12", "--legs", "ray1,ray2", "--shapes", "64x64x64,128x64x32",
                       "--compile-workers", "2", "--num-gpus", "2", "--worker-target", SLOW, "--out", str(tmp_path / "out"),
                       "--work", str(tmp_path / "work")])
    out = capfd.readouterr().out  # the legs' processes write to the inherited stdout
    assert code == 0, out[-3000:]
    report = json.loads((tmp_path / "out" / "ray_scaling.json").read_text())
    assert [r["leg"] for r in report["legs"]] == ["ray1", "ray2"]
    assert all(r["evaluations"] > 0 and r["ok"] == r["evaluations_total"] for r in report["legs"])
    assert report["summary"]["ray"]["scaling"] > 0 and report["meta"]["smoke_test"] is True
    assert (tmp_path / "out" / "ray_scaling.csv").read_text().startswith("leg,pool,gpus")
    assert "[ray2] actors up on GPU(s) ['0', '1']" in out and "2 GPUs give" in out
