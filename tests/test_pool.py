"""LocalPool plumbing on CPU: real NVRTC compiles, real worker processes, a fake GPU handler."""
from __future__ import annotations

import time

import pytest

from evaluators.run._builtin_kernels import naive_candidate
from evaluators.pools._pool import LocalPool
from populations import Shape, Status

pytest.importorskip("evaluators.compile._compile")

FAKE = "fake_gpu_worker:make_handler"
S1, S2 = Shape.parse("64x64x64:TN"), Shape.parse("128x64x32:TN")


def cand(fake: str = "ok", shapes=(S1,), tile: int = 16):
    c = naive_candidate(shapes, tile=tile)
    return c.derive(meta={"fake": fake}) if fake != "ok" else c


def pool(tmp_path, **kw) -> LocalPool:
    deadlines = {"startup": 30.0, "probe": 10.0, "load": 5.0, "correctness": 2.0, "timing": 5.0}
    return LocalPool(gpus=[0], compile_workers=2, target=FAKE, log_dir=str(tmp_path), deadlines=deadlines,
                     cache_dir=str(tmp_path / "cache"), **kw)


def test_ok_candidates_get_one_evaluation_per_shape_with_phase_seconds(tmp_path):
    with pool(tmp_path) as p:
        evals = p.evaluate([cand(shapes=(S1, S2)), cand(tile=8)])
    assert [e.shape for e in evals] == [S1, S2, S1]
    assert all(e.status is Status.OK for e in evals)
    assert all(e.compile_s > 0 and e.correctness_s > 0 and e.timing_s > 0 for e in evals)
    assert evals[0].kernels and evals[0].kernels[0].name == "evo_naive_gemm"
    assert evals[0].arch == "sm_90a"
    assert evals[0].provenance["gpu_index"] == 0


def test_crash_hang_and_compile_error_each_get_a_status_and_the_pool_survives(tmp_path):
    good = naive_candidate((S1,))
    broken = good.derive(source=good.source.replace("acc += p;", "acc += p + no_such_variable;"))
    with pool(tmp_path) as p:
        futs = [p.submit(c) for c in (cand("segv"), cand("ok", tile=8), cand("hang"), broken, cand("ok", tile=32))]
        evals = [f.result(timeout=120)[0] for f in futs]
        assert [e.status for e in evals] == [Status.RUNTIME_ERROR, Status.OK, Status.TIMEOUT,
                                             Status.COMPILE_ERROR, Status.OK]
        assert "SIGSEGV" in evals[0].message and "correctness" in evals[2].message
        assert p.stats.restarts == 2
        assert 0 < p.stats.busy_fraction() <= 1.0


def test_shapes_finished_before_a_crash_keep_their_results(tmp_path):
    with pool(tmp_path) as p:
        first, second = p.evaluate([cand("hang", shapes=(S1, S2))])
    assert first.status is Status.OK and first.correctness_s > 0
    assert second.status is Status.TIMEOUT and "correctness" in second.message


def test_a_gpu_whose_worker_cannot_start_leaves_the_work_to_the_others(tmp_path):
    deadlines = {"startup": 30.0, "probe": 10.0}
    with LocalPool(gpus=[0, 1], compile_workers=2, target=FAKE, log_dir=str(tmp_path), deadlines=deadlines,
                   cache_dir=str(tmp_path / "cache"), worker_options={"fail_gpu": "1"}) as p:
        evals = p.evaluate([cand(tile=t) for t in (4, 8, 16, 32)])
    assert [e.status for e in evals] == [Status.OK] * 4
    assert {e.provenance["gpu_index"] for e in evals} == {0}


def test_a_crashing_compiler_gives_compile_error_not_a_stranded_future(tmp_path):
    def broken_compiler(*args, **kwargs):
        raise OSError("no space left on device (test double)")

    with pool(tmp_path, compile_fn=broken_compiler) as p:
        (e,) = p.submit(cand()).result(timeout=60)
    assert e.status is Status.COMPILE_ERROR and "no space left" in e.message


def test_submit_applies_back_pressure(tmp_path):
    with pool(tmp_path, max_in_flight=1) as p:
        t0 = time.monotonic()
        f1 = p.submit(cand())
        f2 = p.submit(cand(tile=8))  # waits for f1's slot
        assert f1.done()
        assert f2.result(timeout=60)[0].status is Status.OK
        assert time.monotonic() - t0 < 60


def test_cancel_all_drops_queued_work_and_close_returns_promptly(tmp_path):
    from concurrent.futures import CancelledError

    with pool(tmp_path) as p:
        first = p.submit(cand("hang"))  # occupies the only GPU worker until its 2 s deadline
        deadline = time.monotonic() + 60
        while p.stats.first_job is None and time.monotonic() < deadline:  # the hang is on the GPU
            time.sleep(0.05)
        queued = [p.submit(cand(tile=t)) for t in (8, 32)]  # compiling or waiting behind the hang
        p.cancel_all()
        for f in queued:
            with pytest.raises(CancelledError):
                f.result(timeout=30)
        with pytest.raises(RuntimeError, match="cancelled"):
            p.submit(cand(tile=4))
        t0 = time.monotonic()
    assert time.monotonic() - t0 < 30  # close() did not evaluate the dropped jobs
    assert first.result(timeout=1)[0].status is Status.TIMEOUT  # the job on the GPU kept its result


def test_reading_a_result_does_not_hold_up_the_next_job(tmp_path):
    """The GPU thread hands the worker its next job while the previous result is still being
    turned into Evaluations (a slow reader stands in for a loaded parent)."""
    batch = [cand(), cand(tile=8), cand(tile=32)]
    with pool(tmp_path) as p:
        p.evaluate(batch)  # compiles cached: the jobs below are ready at once
        sup = p.supervisors[0]
        starts, read = [], []
        run, evaluations = sup.run, p._core.evaluations

        def timed_run(job):
            starts.append(time.monotonic())
            return run(job)

        def slow_read(*a):
            time.sleep(1.0)
            read.append(time.monotonic())
            return evaluations(*a)
        sup.run, p._core.evaluations = timed_run, slow_read
        evals = p.evaluate(batch)
    assert [e.status for e in evals] == [Status.OK] * 3 and len(starts) == 3
    assert starts[1] < read[0] and starts[2] < read[1]  # sent before the previous result was read
