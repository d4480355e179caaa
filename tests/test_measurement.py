"""How an evaluation was measured is a record of its own (issue 37): the worker fills a typed
ShapeDraft, sends a frozen ShapeResult (shape a Shape, picklable), the pool carries its
Measurement onto the Evaluation, and provenance keeps to the GPU, driver, clocks and worker.
Archives written before, with those keys in the provenance, still open and read the same."""
from __future__ import annotations

import dataclasses
import pickle

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import populations._archive as archive_mod
from evaluators import Result, ShapeDraft, ShapeResult
from evaluators.run._builtin_kernels import naive_candidate
from populations import (MEASUREMENT_KEYS, Archive, CodecError, Evaluation, Measurement, Shape, Status, TimerResult,
                         decode, encode, from_plain, to_plain)

SHAPE = Shape.parse("64x64x64:TN")
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
words = st.text(max_size=12)
measurements = st.builds(
    Measurement, checks=st.lists(words, max_size=4).map(tuple), phases=st.dictionaries(words, finite, max_size=3),
    rotation_sets=st.none() | st.integers(0, 64), rotation_bytes=st.none() | st.integers(0, 1 << 40),
    device_rotations=st.lists(st.fixed_dictionaries({"median": finite, "baseline_median": finite}), max_size=3).map(tuple),
    floor_s=st.none() | finite, memo_check=st.none() | words, host_timers=st.none() | words,
    server_gaps_s=st.none() | finite, device_warmup_s=st.none() | finite, device_capture_s=st.none() | finite,
    device_prewarm_replays=st.none() | st.integers(0, 100), device_rounds=st.none() | st.integers(0, 40),
    device_rounds_planned=st.none() | st.integers(0, 40), device_replays=st.none() | st.integers(0, 1000),
    device_syncs=st.none() | st.integers(0, 100),
    gpu_lease=st.none() | st.fixed_dictionaries({"waited_s": finite, "timed_out": st.booleans(), "enabled": st.booleans()}))


@settings(max_examples=80, deadline=None)
@given(measurements)
def test_a_measurement_round_trips_alone_and_on_an_evaluation(m: Measurement) -> None:
    assert Measurement.from_dict(m.to_dict()) == m
    ev = Evaluation("ab" * 10, SHAPE, Status.OK, provenance={"gpu": "NVIDIA H200"}, created=1.0, measurement=m)
    data = encode(ev)
    back = decode(data)
    assert back == ev and back.measurement == m and encode(back) == data
    assert ("measurement" in to_plain(ev)) == bool(m)  # written only when something was recorded


def test_a_measurement_refuses_junk() -> None:
    with pytest.raises(ValueError, match="rotatoin_sets"):
        Measurement.from_dict({"rotatoin_sets": 4})
    ev = to_plain(Evaluation("ab" * 10, SHAPE, Status.OK, created=1.0, measurement=Measurement(rotation_sets=4)))
    for junk in ({"phases": "fast"}, {"rotation_sets": "many"}, [3], 7):
        with pytest.raises(CodecError):
            from_plain({**ev, "measurement": junk})


def _old_plain(ev: Evaluation) -> dict:
    """The form the pool and codec wrote before Measurement: its keys folded into provenance, the
    pool's unset ones as None, no ``measurement`` key."""
    plain = to_plain(ev)
    plain.pop("measurement", None)
    plain["provenance"] = {**plain["provenance"], "checks": ["smoke", "full"], "rotation_sets": 6,
                           "rotation_bytes": 6 << 20, "floor_s": 1e-6, "phases": {"correctness": 0.25, "device": 0.5},
                           "memo_check": None, "host_timers": "run", "device_warmup_s": 0.1, "device_capture_s": 0.02,
                           "device_prewarm_replays": 3, "gpu_lease": {"waited_s": 0.0, "timed_out": False, "enabled": True},
                           "device_rotations": [{"median": 1e-5, "baseline_median": 2e-5}]}
    return plain


def test_an_old_record_with_the_keys_in_its_provenance_is_migrated() -> None:
    ev = Evaluation("ab" * 10, SHAPE, Status.OK, provenance={"gpu": "NVIDIA H200", "driver": "580.95.05",
                                                             "sm_clock_mhz": 1980}, created=1.0)
    back = decode(msgpack.packb(_old_plain(ev), use_bin_type=True))
    assert dict(back.provenance) == {"gpu": "NVIDIA H200", "driver": "580.95.05", "sm_clock_mhz": 1980}
    m = back.measurement
    assert m.checks == ("smoke", "full") and m.rotation_sets == 6 and m.phases == {"correctness": 0.25, "device": 0.5}
    assert m.memo_check is None and m.host_timers == "run" and m.gpu_lease["enabled"] is True
    assert m.device_rotations == ({"median": 1e-5, "baseline_median": 2e-5},)
    assert decode(encode(back)) == back and "measurement" in to_plain(back)  # written back in the new form


def test_an_archive_written_before_opens_with_the_measurement_lifted(tmp_path, monkeypatch) -> None:
    cand = naive_candidate((SHAPE,))
    ev = Evaluation(cand.id, SHAPE, Status.OK, created=1.0, provenance={"gpu": "NVIDIA H200"},
                    timers={"device": TimerResult(1e-5, 1e-5, 1e-5, 2e-5, 2e-5, 2e-5, 10)})
    old_encode = archive_mod.encode
    monkeypatch.setattr(archive_mod, "encode", lambda r: msgpack.packb(_old_plain(r), use_bin_type=True)
                        if isinstance(r, Evaluation) else old_encode(r))  # the bytes an older evo wrote
    with Archive(tmp_path / "a", "w") as a:
        a.record(cand, [ev])
    monkeypatch.setattr(archive_mod, "encode", old_encode)
    with Archive(tmp_path / "a") as a:
        (got,) = a.evaluations(SHAPE)
        assert not a.problems() and got.fitness == pytest.approx(2.0)
    assert got.measurement.rotation_sets == 6 and "checks" not in got.provenance
    assert got.provenance == {"gpu": "NVIDIA H200"}


def test_the_worker_builds_a_frozen_shape_result_that_pickles() -> None:
    draft = ShapeDraft(SHAPE)
    draft.note(checks=("smoke",))
    draft.phases["correctness"] = 0.1
    draft.note(rotation_sets=4, host_timers="run")
    draft.provenance["sm_clock_mhz"] = 1980
    draft.timers["device"] = {"median": 1e-5, "baseline_median": 2e-5}
    rec = draft.build()
    assert isinstance(rec.shape, Shape) and rec.shape == SHAPE
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.status = Status.FLAGGED  # type: ignore[misc]
    assert rec.measurement == Measurement(checks=("smoke",), phases={"correctness": 0.1}, rotation_sets=4, host_timers="run")
    assert dict(rec.provenance) == {"sm_clock_mhz": 1980}
    assert pickle.loads(pickle.dumps(rec)) == rec  # a record of populations types: it crosses as it is
    assert ShapeResult.from_wire(rec.to_wire()) == rec
    wire = rec.to_wire()
    assert wire["shape"] == str(SHAPE) and wire["rotation_sets"] == 4 and "floor_s" not in wire
    assert Result.from_wire({"status": "ok", "shapes": [wire]}).shape(SHAPE) == rec
    failed = ShapeDraft(SHAPE).fail(Status.REJECTED, "plan does not resolve").build()
    assert failed.status is Status.REJECTED and not failed.measurement
    with pytest.raises(TypeError, match="rotatoins"):
        ShapeDraft(SHAPE).fail(Status.REJECTED, "x", rotatoins=2)
    with pytest.raises(TypeError, match="rotatoin_sets"):
        ShapeDraft(SHAPE).note(rotatoin_sets=2)
    gave_up = ShapeDraft(SHAPE).fail(Status.INCORRECT, "wrong", checks=("smoke",), max_error=0.5).build()
    assert gave_up.measurement.checks == ("smoke",) and gave_up.max_error == 0.5


def test_measurement_keys_name_its_fields() -> None:
    assert MEASUREMENT_KEYS == tuple(f.name for f in dataclasses.fields(Measurement))


def test_the_pool_puts_the_measurement_on_the_evaluation_not_in_provenance(tmp_path) -> None:
    """The pool's reading of a worker result (the CPU test double of tests/fake_pool.py does not
    go through it, so the core is driven with a result wire dict)."""
    from evaluators.pools._pool_core import PoolCore
    from types import SimpleNamespace

    cand = naive_candidate((SHAPE,))
    draft = ShapeDraft(SHAPE, timers={"device": {"median": 1e-5, "lo": 1e-5, "hi": 1e-5, "baseline_median": 2e-5,
                                                 "baseline_lo": 2e-5, "baseline_hi": 2e-5, "samples": 10}})
    draft.note(checks=("smoke",), rotation_sets=4)
    draft.provenance["sm_clock_mhz"] = 1980
    wire = {"status": "ok", "seed": 7, "load_s": 0.01, "shapes": [draft.build().to_wire()]}
    core = object.__new__(PoolCore)
    core._arch = "sm_90a"
    worker = SimpleNamespace(gpu=0, pid=123, info={"provenance": {"gpu": "NVIDIA H200", "driver": "580.95.05"}})
    item = SimpleNamespace(candidate=cand, compiled=SimpleNamespace(kernels=(), seconds=0.5, arch="sm_90a"))
    (ev,) = core.evaluations(item, wire, worker)
    assert ev.status is Status.OK, ev.message
    assert ev.measurement == Measurement(checks=("smoke",), rotation_sets=4)
    assert not set(ev.provenance) & set(MEASUREMENT_KEYS)
    assert ev.provenance["gpu"] == "NVIDIA H200" and ev.provenance["sm_clock_mhz"] == 1980 and ev.provenance["seed"] == 7
