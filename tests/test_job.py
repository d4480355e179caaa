"""The worker contract's types (evaluators.Job, Result): typed in the parent, dicts on the wire."""
from __future__ import annotations

import json
import pickle

import pytest

from evaluators import JOB_OPTIONS, PRECISE_JOB, Job, LocalPool, Result, ShapeResult
from evaluators.run._builtin_kernels import naive_candidate
from populations import Shape, Status

S1, S2 = Shape.parse("64x64x64:TN"), Shape.parse("128x64x32:TN")


def _job(**options) -> Job:
    cand = naive_candidate((S1, S2))
    return Job(cubin=b"\x7fELF", plan=cand.plan, shapes=cand.shapes, candidate_id=cand.id,
               meta={"fake": "ok"}).with_options(options)


def test_a_job_survives_the_wire_and_leaves_unset_options_out():
    job = _job(elite_threshold=1.25, **PRECISE_JOB)
    wire = job.to_wire()
    assert wire["shapes"] == [str(S1), str(S2)] and wire["plan"] == job.plan.to_dict()
    assert wire["elite_threshold"] == 1.25 and wire["rotations"] == 3
    assert "memo_check" not in wire and "seed" not in wire  # None: the harness's own default
    back = Job.from_wire(pickle.loads(pickle.dumps(wire)))
    assert back == job


def test_an_unknown_or_missing_key_is_refused_on_both_sides(tmp_path):
    with pytest.raises(TypeError, match="budget_sec"):
        _job(budget_sec=0.2)
    with pytest.raises(TypeError, match="unknown"):
        Job.from_wire({**_job().to_wire(), "rotatoins": 2})
    with pytest.raises(TypeError, match="missing"):
        Job.from_wire({"plan": {}, "shapes": []})
    with pytest.raises(TypeError, match="budget_sec"):  # at the pool's construction, before any compile
        LocalPool(gpus=[0], target="fake_gpu_worker:make_handler", log_dir=str(tmp_path),
                  job_options={"budget_sec": 0.2})
    assert "elite_threshold" in JOB_OPTIONS and "cubin" not in JOB_OPTIONS


def test_a_result_reads_statuses_as_the_enum_and_keeps_the_wire_strings():
    wire = {"status": "timeout", "message": "timing phase overran", "fatal": True, "phase": "timing",
            "shapes": [{"shape": str(S1), "status": "ok", "timers": {}, "flags": [], "checks": ["smoke"],
                        "correctness_s": 0.1, "new_key": 7}]}
    res = Result.from_wire(wire)
    assert res.status is Status.TIMEOUT and res.fatal and res.phase == "timing"
    first = res.shape(S1)
    assert first is not None and first.status is Status.OK and first.measurement.checks == ("smoke",)
    assert first.shape == S1  # a Shape, parsed from its wire string
    assert first.extra == {"new_key": 7}  # a key this parent does not read is kept, not lost silently
    assert res.shape(S2) is None
    assert json.dumps({"status": Status.FLAGGED}) == '{"status": "flagged"}'  # a str enum: same wire form
    assert Result.from_wire({}).status is Status.RUNTIME_ERROR


def test_a_shape_result_goes_back_to_its_wire_dict_and_takes_a_flag():
    """The harness holds ShapeResult records and sends their wire form: the round trip loses nothing."""
    wire = {"shape": str(S1), "status": Status.OK, "message": "", "flags": ["x"],
            "timers": {"device": {"median": 1e-5, "baseline_median": 2e-5}}, "max_error": 0.01, "correctness_s": 0.1,
            "timing_s": 0.2, "provenance": {"sm_clock_mhz": 1980}, "checks": ["smoke"],
            "phases": {"correctness": 0.1}, "rotation_sets": 4, "new_key": 7}
    rec = ShapeResult.from_wire(wire)
    assert rec.to_wire() == wire
    assert pickle.loads(pickle.dumps(rec.to_wire())) == wire  # builtins only: it crosses the pipe
    flagged = rec.flagged("host thread count changed")
    assert flagged.status is Status.FLAGGED and flagged.flags == ("x", "host thread count changed")
    assert rec.flags == ("x",)  # a record: flagging makes a new one
    failed = ShapeResult.from_wire({**wire, "status": "incorrect", "fatal": True})
    assert failed.flagged("y") is failed and failed.to_wire()["fatal"] is True
    assert "fatal" not in rec.to_wire() and "floor_s" not in rec.to_wire()  # unset: left out, as before
