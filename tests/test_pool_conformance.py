"""The evaluator pool contract (evaluators.EvaluatorPool), run over every pool.

Real parts: LocalPool and RayPool with real NVRTC compiles, real worker processes (inside Ray
actors for RayPool, on a real local cluster with two CPUs and two *logical* GPUs); the GPU
handler inside the worker is the test double ``fake_gpu_worker`` (no GPU on this machine).
``FakeEvaluatorPool`` (tests/fake_pool.py), the engine tests' double, must keep the same
contract, or the engine tests would test an engine against a pool that cannot exist.
"""
from __future__ import annotations

import os
import time
from concurrent.futures import CancelledError
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from evaluators import EvaluatorPool, LocalPool
from populations import Evaluation, Shape, Status

ROOT = Path(__file__).resolve().parents[1]
S1, S2 = Shape.parse("64x64x64:TN"), Shape.parse("128x64x32:TN")
FAKE = "fake_gpu_worker:make_handler"
DEADLINES = {"startup": 60.0, "probe": 20.0, "load": 10.0, "correctness": 10.0, "timing": 10.0}


def _candidates(n: int, shapes: tuple[Shape, ...] = (S1,)) -> list[Any]:
    from evaluators.run._builtin_kernels import naive_candidate

    return [naive_candidate(shapes, tile=t) for t in (4, 8, 16, 32, 64)[:n]]


def _local(tmp_path: Path) -> EvaluatorPool:
    pytest.importorskip("evaluators.compile._compile")
    return LocalPool(gpus=[0], compile_workers=2, target=FAKE, log_dir=str(tmp_path), deadlines=DEADLINES,
                     cache_dir=str(tmp_path / "cache"))


def _fake(tmp_path: Path) -> EvaluatorPool:
    from fake_pool import FakeEvaluatorPool

    return FakeEvaluatorPool(delay_s=0.0, fail=0.0, incorrect=0.0, crash=0.0, raise_=0.0)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A local Ray cluster for the module (two CPUs, two logical GPUs); skipped without ray."""
    ray = pytest.importorskip("ray", reason="the RayPool leg needs ray (pip install -e '.[dev]' installs it)")
    pytest.importorskip("evaluators.compile._compile")
    if ray.is_initialized():
        ray.shutdown()
    # address="local": a new cluster of our own, never one another run left on this host (ray.init
    # without an address joins a live local cluster, and then refuses num_cpus/num_gpus)
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}})
    yield ray
    ray.shutdown()


POOLS: dict[str, Callable[..., EvaluatorPool]] = {"local": _local, "fake": _fake}


@pytest.fixture(params=["local", "ray", "fake"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], EvaluatorPool]:
    """A factory for the pool under test (each call a fresh one)."""
    if request.param == "ray":
        request.getfixturevalue("ray_cluster")
        from evaluators import RayPool

        return lambda: RayPool(gpus=2, compile_workers=2, target=FAKE, deadlines=DEADLINES,
                               log_dir=str(tmp_path / "logs"), cache_dir=str(tmp_path / "cache"), arch="sm_90a")
    return lambda: POOLS[request.param](tmp_path)


def test_a_pool_is_an_evaluator_pool_with_gpus_and_an_arch(make):
    with make() as pool:
        assert isinstance(pool, EvaluatorPool)
        assert all(isinstance(g, int) for g in pool.gpus)
        assert pool.arch is None or pool.arch.startswith("sm_")


def test_submit_gives_one_evaluation_per_claimed_shape_in_order(make):
    two = _candidates(1, (S1, S2))[0]
    with make() as pool:
        evals = pool.submit(two, elite_threshold=1.25).result(timeout=120)
    assert [e.shape for e in evals] == [S1, S2]
    assert all(isinstance(e, Evaluation) and e.candidate_id == two.id for e in evals)
    assert all(isinstance(e.status, Status) for e in evals)


def test_evaluate_keeps_candidate_then_shape_order(make):
    cands = _candidates(3)
    with make() as pool:
        evals = pool.evaluate(cands)
    assert [e.candidate_id for e in evals] == [c.id for c in cands]
    assert [e.status for e in evals] == [Status.OK] * 3  # the doubles time everything as ok


def test_after_cancel_all_submit_refuses_and_close_returns(make):
    pool = make()
    futures = [pool.submit(c) for c in _candidates(2)]
    pool.cancel_all()
    with pytest.raises(RuntimeError):
        pool.submit(_candidates(1)[0])
    t0 = time.monotonic()
    pool.close()
    pool.close()  # twice is allowed
    assert time.monotonic() - t0 < 60
    for f in futures:  # each either dropped or finished with its evaluations, never left pending
        try:
            assert len(f.result(timeout=30)) == 1
        except CancelledError:
            pass


def test_after_close_submit_refuses(make):
    pool = make()
    pool.close()
    with pytest.raises(RuntimeError):
        pool.submit(_candidates(1)[0])


def test_the_base_defaults_are_what_the_engine_relies_on():
    """A minimal pool (only ``submit``) has no GPUs, no arch, a no-op cancel and close, and
    ``evaluate`` built on ``submit``; the base itself cannot be made."""
    from concurrent.futures import Future

    class Minimal(EvaluatorPool):
        def submit(self, candidate, *, elite_threshold=None):  # type: ignore[no-untyped-def]
            f: Future = Future()
            f.set_result([Evaluation(candidate_id=candidate.id, shape=s, status=Status.REJECTED)
                          for s in candidate.shapes])
            return f

    with pytest.raises(TypeError):
        EvaluatorPool()  # type: ignore[abstract]
    with Minimal() as pool:
        assert tuple(pool.gpus) == () and pool.arch is None
        pool.cancel_all()
        evals = pool.evaluate(_candidates(2, (S1, S2)))
    assert [e.shape for e in evals] == [S1, S2, S1, S2]
