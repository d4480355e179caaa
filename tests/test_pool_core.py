"""PoolCore's results thread (shared by LocalPool and RayPool): a GPU's dispatcher hands a worker's
result over and returns at once; the thread turns results into Evaluations and resolves the
futures in arrival order, and survives a result it cannot read."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from populations import Shape, Status, load_templates

from evaluators.pools._pool_core import PoolCore, PoolItem, PoolStats


def _core() -> PoolCore:
    return PoolCore("TestPool", timers=("device",), qps=1000.0, job_options=None, cache_dir=None,
                    compile_timeout_s=10.0, compile_fn=lambda *a, **k: None, slots=8, stats=PoolStats(), arch="sm_90a")


def _items(core: PoolCore, n: int) -> list[PoolItem]:
    t = load_templates()["sm80_mma"]
    shape = Shape.parse("128x128x64")
    import random

    return [core.admit(t.candidate(k, shape), None) for k in t.sample(random.Random(1), shape, n)]


def test_hand_over_returns_at_once_and_futures_resolve_in_order_on_the_results_thread() -> None:
    core = _core()
    seen: list[tuple[str, str]] = []

    def slow_read(item, result, worker):  # the reading of a result takes a while
        time.sleep(0.05)
        seen.append((item.candidate.id, threading.current_thread().name))
        return [core.record(item.candidate, s, Status.OK, "") for s in item.candidate.shapes]

    core.evaluations = slow_read  # type: ignore[method-assign]
    items = _items(core, 4)
    t0 = time.monotonic()
    for it in items:
        core.hand_over(it, {"status": "ok"}, SimpleNamespace(gpu=0, pid=1, info={}))
    assert time.monotonic() - t0 < 0.05  # the dispatcher did not wait for the reads
    core.stop_results()
    assert [cid for cid, _ in seen] == [it.candidate.id for it in items]
    assert {name for _, name in seen} == {"TestPool-results"}
    assert all(it.future.result(timeout=1)[0].status is Status.OK for it in items)
    assert core.stats.evaluated == 4


def test_a_result_that_cannot_be_read_becomes_a_runtime_error_and_later_ones_still_resolve() -> None:
    core = _core()
    first, second = _items(core, 2)
    calls = iter([RuntimeError("bad result"), None])

    def read(item, result, worker):
        exc = next(calls)
        if exc:
            raise exc
        return [core.record(item.candidate, s, Status.OK, "") for s in item.candidate.shapes]

    core.evaluations = read  # type: ignore[method-assign]
    core.hand_over(first, {}, None)
    core.hand_over(second, {}, None)
    core.stop_results()
    assert first.future.result(timeout=1)[0].status is Status.RUNTIME_ERROR
    assert second.future.result(timeout=1)[0].status is Status.OK
