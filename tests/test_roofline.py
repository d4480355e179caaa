"""Roofline in the loop (issue 26): the arithmetic, the calibration file and cache, the budget
allocation by headroom (pure functions), and the engine spending its slots where the headroom is.

The evaluator pool is the test double ``fake_pool.FakeEvaluatorPool`` (no GPU here); the GPU
measurement itself (``evaluators.run._calibrate``) is replaced by a named stand-in measurer.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from evo.search._budget import headroom, pick_shape, shape_weights
from evo.search._calibration import cache_path, current, ensure_calibration, load_calibration
from evo.cli._orchestrate import expand_operators, make_operators
from evo.search._config import ConfigError, merge
from evo.search._engine import Engine
from evo.search._progress import EVENTS_FILE, EventLog, read_events
from fake_pool import FakeEvaluatorPool
from populations import (CALIBRATION_FILE, H200_DEFAULTS, Archive, Calibration, Shape, attainable_frac,
                         attainable_time, load_templates, read_calibration, roofline_frac, roofline_time,
                         write_calibration)

TEMPLATES = load_templates()
BIG = Shape.parse("4096x4096x4096")
SMALL = Shape.parse("64x128x64")


# -- arithmetic ---------------------------------------------------------------------------------
def test_roofline_matches_the_issue_figures() -> None:
    """Issue 26: cuBLAS at 1x4096x4096 took 14.06 us: 0.55 of max(2MNK/790e12, bytes/4.3e12) in the
    issue's figures, 0.53 against HBM's 4.5 TB/s read rate, which the roofline now uses."""
    s = Shape(1, 4096, 4096)
    assert roofline_time(s) == pytest.approx(2 * (4096 + 4096 * 4096 + 4096) / 4.5e12)
    assert roofline_frac(s, 14.06e-6) == pytest.approx(0.555 * 4.3 / 4.5, abs=0.003)
    big = Shape(8192, 8192, 8192)
    assert roofline_time(big) == pytest.approx(big.flops / 790e12)  # compute bound
    assert roofline_frac(s, 0.0) is None and roofline_frac(s, None) is None and roofline_frac(s, math.nan) is None


def test_attainable_time_has_the_launch_floor_and_the_read_bandwidth() -> None:
    tiny = Shape(1, 576, 576)
    assert roofline_time(tiny) < 1e-6 < attainable_time(tiny) == H200_DEFAULTS.launch_floor_s
    assert attainable_frac(tiny, 2.2e-6) == pytest.approx(2 / 2.2)
    w = Shape(1, 128256, 4096)  # weight streaming: 4.5 TB/s read, not the 4.3 of a copy
    assert attainable_time(w) == pytest.approx(w.min_bytes / 4.5e12)
    # the anchors' GEMV streams at the read rate: 1.0 of the read roofline (it was 1.05 of the copy one)
    assert roofline_frac(w, 233e-6) == pytest.approx(1.0, abs=0.005)
    assert roofline_time(w) == attainable_time(w)  # both limits use the read rate where no floor applies


def test_calibration_file_round_trips_and_bad_files_read_as_none(tmp_path: Path) -> None:
    cal = Calibration(7.5e14, 4.4e12, 4.2e12, 1.5e-6, device="NVIDIA H200", source="measured", date="d",
                      notes={"sms": 132})
    path = write_calibration(tmp_path, cal)
    assert path.name == CALIBRATION_FILE and read_calibration(tmp_path) == cal
    path.write_text("{not json")
    assert read_calibration(tmp_path) is None and load_calibration(tmp_path) is H200_DEFAULTS
    path.write_text(json.dumps({**cal.to_dict(), "peak_flops": -1}))
    assert read_calibration(tmp_path) is None
    with pytest.raises(ValueError):
        Calibration(0, 1, 1, 0)


# -- the per-device cache -----------------------------------------------------------------------
def _stand_in_measurer(calls: list, device: str = "NVIDIA H200"):
    """Test double for ``evaluators.run._calibrate`` in its child process (no GPU on this machine)."""
    def measure(timeout_s: float) -> Calibration:
        calls.append(timeout_s)
        return Calibration(7.7e14, 4.5e12, 4.3e12, 1.2e-6, device=device, source="measured", date="now",
                           notes={"copy_kernel": "sm"})
    return measure


def test_calibration_is_measured_once_per_device_then_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVO_CALIBRATION_DIR", str(tmp_path / "cache"))
    calls: list = []
    a1, a2 = tmp_path / "a1", tmp_path / "a2"
    a1.mkdir(), a2.mkdir()
    name = lambda: "NVIDIA H200"  # noqa: E731
    cal = ensure_calibration(a1, name_of=name, measurer=_stand_in_measurer(calls))
    assert cal.source == "measured" and len(calls) == 1
    assert read_calibration(a1) == cal and read_calibration(cache_path("NVIDIA H200")) == cal
    assert ensure_calibration(a1, name_of=name, measurer=_stand_in_measurer(calls)) == cal  # the archive's own
    other = ensure_calibration(a2, name_of=name, measurer=_stand_in_measurer(calls))  # a new archive: the cache
    assert other.source == "cached" and other.peak_flops == cal.peak_flops and len(calls) == 1
    moved = ensure_calibration(a1, name_of=lambda: "NVIDIA A100", measurer=_stand_in_measurer(calls, "NVIDIA A100"))
    assert moved.device == "NVIDIA A100" and len(calls) == 2  # the archive moved to another GPU: measured again


def test_a_calibration_from_before_the_sm_copy_kernel_is_measured_again(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Its copy_bw was a memcpy graph node's (a copy engine: 2.71 TB/s on an H200); with a GPU
    present it is replaced, archive file and cache alike; without one it is still read."""
    monkeypatch.setenv("EVO_CALIBRATION_DIR", str(tmp_path / "cache"))
    old = Calibration(7.7e14, 4.56e12, 2.71e12, 6.8e-7, device="NVIDIA H200", source="measured", date="then")
    arch = tmp_path / "a"
    arch.mkdir()
    write_calibration(arch, old)
    write_calibration(cache_path("NVIDIA H200"), old)
    assert not current(old) and current(H200_DEFAULTS)
    assert ensure_calibration(arch, name_of=lambda: None) == old  # no GPU here: the stored figures stand
    calls: list = []
    cal = ensure_calibration(arch, name_of=lambda: "NVIDIA H200", measurer=_stand_in_measurer(calls))
    assert len(calls) == 1 and cal.copy_bw == 4.3e12 and current(cal)
    assert read_calibration(arch) == cal and read_calibration(cache_path("NVIDIA H200")) == cal


def test_no_gpu_or_a_failed_measurement_gives_the_defaults_and_writes_nothing(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVO_CALIBRATION_DIR", str(tmp_path / "cache"))
    assert ensure_calibration(tmp_path, name_of=lambda: None) is H200_DEFAULTS
    def broken(timeout_s: float) -> Calibration:
        raise RuntimeError("exit 1: no CUDA")
    assert ensure_calibration(tmp_path, name_of=lambda: "NVIDIA H200", measurer=broken) is H200_DEFAULTS
    assert not (tmp_path / CALIBRATION_FILE).exists() and not (tmp_path / "cache").exists()


# -- allocation (pure) --------------------------------------------------------------------------
def test_weights_are_headroom_and_saturated_or_stalled_shapes_yield() -> None:
    w = shape_weights({"a": 0.5, "b": 0.95, "c": None, "d": 0.2, "e": 0.1}, {"e": True}, saturated=0.9)
    assert w == {"a": pytest.approx(0.5), "b": 0.0, "c": 1.0, "d": pytest.approx(0.8), "e": 0.0}
    assert shape_weights({"a": 0.93, "b": 1.2}) == {"a": 1.0, "b": 1.0}  # nobody has headroom: spread evenly
    assert shape_weights({"a": 0.5}, {"a": True}) == {"a": 1.0}
    assert headroom(1.3) == 0.0 and headroom(-0.1) == 1.0 and headroom(None) == 1.0


def test_fresh_shapes_keep_full_weight_and_a_shape_behind_its_baseline_is_not_saturated() -> None:
    """A shape's first ``min_evals`` evaluations are at weight 1 whatever its headroom (random-shape
    seed 7: mid shapes near the roofline got 1-4 evaluations, all below cuBLAS); a shape at the
    saturation fraction whose best is still slower than its baseline keeps its headroom; a stalled
    shape yields even while fresh or behind."""
    fracs = {"near": 0.8, "sat": 0.92, "sat_behind": 0.92, "stalled": 0.3}
    w = shape_weights(fracs, {"stalled": True}, 0.9, fresh={"near": True, "stalled": True},
                      behind={"sat_behind": True, "stalled": True})
    assert w == {"near": 1.0, "sat": 0.0, "sat_behind": pytest.approx(0.08), "stalled": 0.0}
    assert shape_weights(fracs, {"stalled": True}, 0.9)["near"] == pytest.approx(0.2)  # not fresh: its headroom


def test_pick_shape_is_weighted_fair_sharing() -> None:
    order = ["a", "b", "c"]
    weights = {"a": 0.75, "b": 0.25, "c": 0.0}
    loads = Counter()
    for _ in range(400):
        s = pick_shape(order, loads, weights)
        loads[s] += 1
    assert loads["c"] == 0 and loads["a"] == pytest.approx(300, abs=2) and loads["b"] == pytest.approx(100, abs=2)
    assert pick_shape(order, {"a": 5, "b": 1, "c": 3}, {}) == "b"  # none positive: the least loaded
    assert pick_shape(order, {}, {"a": 1.0, "b": 1.0, "c": 1.0}) == "a"  # ties: config order


def test_allocation_config_is_checked() -> None:
    with pytest.raises(ConfigError):
        merge({"allocation": {"saturated": 0}}, {"shapes": ["1x2x3"], "archive": "x"})
    with pytest.raises(ConfigError):
        merge({"allocation": {"min_evals": -1}}, {"shapes": ["1x2x3"], "archive": "x"})
    cfg = merge({"allocation": {"saturated": 0.8, "stall_window": 10, "min_evals": 4}},
                {"shapes": ["1x2x3"], "archive": "x"})
    assert cfg.allocation.saturated == 0.8 and cfg.allocation.stall_window == 10 and cfg.allocation.min_evals == 4


# -- the engine ---------------------------------------------------------------------------------
def _run(archive_dir: Path, cal: Calibration, evals: int, **alloc: object) -> list[dict]:
    cfg = merge({"allocation": alloc} if alloc else {},
                {"shapes": [str(BIG), str(SMALL)], "archive": str(archive_dir), "operators": "knob",
                 "progress": "none", "max_evals": evals})
    cfg.operators = expand_operators(cfg.operators)
    pool = FakeEvaluatorPool(delay_s=0.0, fail=0.0, incorrect=0.0, crash=0.0, raise_=0.0)
    with Archive(archive_dir, "w") as archive:
        events = EventLog(archive_dir / EVENTS_FILE)
        Engine(cfg, archive, pool, make_operators(cfg.operators), TEMPLATES, events=events, calibration=cal).run()
        events.close()
    pool.close()
    return read_events(archive_dir / EVENTS_FILE)


def _toy_calibration() -> Calibration:
    """Ceilings under which the fake pool's BIG times (1 ms / fitness) are at 10 x fitness (> 2) of the
    attainable time (saturated from the first decent kernel), and SMALL is nowhere near its limit."""
    return Calibration(peak_flops=BIG.flops / 1e-2, read_bw=1e18, copy_bw=1e18, launch_floor_s=0.0, device="toy")


def test_engine_gives_a_saturated_shapes_slots_to_the_shape_with_headroom(tmp_path: Path) -> None:
    cal = _toy_calibration()
    # stall detection off: this checks the saturation rule alone (SMALL may otherwise stall after 64
    # evaluations without improvement, as the fake pool's fitnesses fall, and spread the slots evenly)
    events = _run(tmp_path / "a", cal, 120, stall_window=0)
    per = Counter(e["shape"] for e in events if e["event"] == "evaluation")
    assert per[str(SMALL)] >= 100 and per[str(BIG)] <= 20, per
    assert any(e["event"] == "yield" and e["shape"] == str(BIG) and e["why"] == "saturated" for e in events)
    even = Counter(e["shape"] for e in _run(tmp_path / "b", cal, 120, enabled=False) if e["event"] == "evaluation")
    assert abs(even[str(BIG)] - even[str(SMALL)]) <= 8, even  # the old rule: equal shares
    with Archive(tmp_path / "a", "r") as ar:  # every timed evaluation recorded its roofline fraction
        evs = [e for e in ar.evaluations(BIG) if "device" in e.timers]
        assert evs and all(e.roofline_frac == pytest.approx(roofline_time(BIG, cal) / e.timers["device"].median)
                           for e in evs)


def test_engine_reads_the_archives_calibration(tmp_path: Path) -> None:
    archive_dir = tmp_path / "a"
    with Archive(archive_dir, "w"):
        pass
    write_calibration(archive_dir, _toy_calibration())
    cfg = merge({}, {"shapes": [str(SMALL)], "archive": str(archive_dir), "progress": "none", "max_evals": 1})
    with Archive(archive_dir, "w") as archive:
        engine = Engine(cfg, archive, FakeEvaluatorPool(delay_s=0.0), {}, TEMPLATES,
                        events=EventLog(archive_dir / EVENTS_FILE))
        assert engine.calibration.device == "toy"


def test_inspect_and_report_show_the_roofline_fraction(tmp_path: Path) -> None:
    """Recorded where the engine recorded it; computed from the timer and the archive's
    calibration for a record from before issue 26 (no field)."""
    from evo.cli._cmd_inspect import build_report
    from evo.cli._report import collect
    from populations import Evaluation, Status, TimerResult

    shape = Shape(1, 4096, 4096)
    t = TEMPLATES["sm80_mma"]
    cands = [t.candidate(k, shape) for k in t.sample(__import__("random").Random(0), shape, 2)]
    timer = lambda s: TimerResult(s, s, s, 14.06e-6, 14.06e-6, 14.06e-6, 5)  # noqa: E731
    root = tmp_path / "a"
    with Archive(root, "w") as ar:
        for c in cands:
            ar.add(c)
        ar.add(Evaluation(cands[0].id, shape, Status.OK, timers={"device": timer(10e-6)}, roofline_frac=0.123))
        ar.add(Evaluation(cands[1].id, shape, Status.OK, timers={"device": timer(12e-6)}))  # an old record
        ar.commit()
    with Archive(root, "r") as ar:
        doc, _ = build_report(ar, None, 10)
        elites = doc["shapes"][0]["elites"]
        assert [e["roofline_frac"] for e in elites] == [0.123, pytest.approx(roofline_time(shape) / 12e-6)]
        assert doc["shapes"][0]["best_roofline_frac"] == 0.123 and doc["calibration"]["source"] == "default"
        write_calibration(root, Calibration(1e15, 9e12, 1e13, 1e-6, device="x", source="measured"))  # read 2x
        doc, _ = build_report(ar, None, 10)
        assert doc["shapes"][0]["elites"][1]["roofline_frac"] == pytest.approx(roofline_time(shape) / 2 / 12e-6)
        assert collect(ar)[0]["roofline_frac"] == 0.123


@pytest.mark.gpu
def test_calibration_measures_plausible_ceilings() -> None:
    """On a GPU: the four figures are of the right order (H200: ~790 TFLOP/s, ~4.5 / 4.3 TB/s, ~1-2 us)."""
    from evaluators.run._calibrate import measure

    cal = measure(reps=3)
    assert cal.source == "measured" and cal.device
    assert 1e13 < cal.peak_flops < 3e15 and 1e11 < cal.read_bw < 2e13 and 1e11 < cal.copy_bw < 2e13
    # the copy is an SM kernel's (3.92 TB/s on the H200 where a graph memcpy node moved 2.57), and it
    # moves each byte twice, so it cannot beat the read rate by much
    assert cal.notes["copy_kernel"] == "sm" and cal.copy_bw < 1.2 * cal.read_bw and cal.notes["memcpy_bw"] > 0
    assert 1e-8 < cal.launch_floor_s < 2e-5


def test_a_shape_whose_every_result_fails_stops_counting_as_all_headroom(tmp_path: Path) -> None:
    """Unmeasured means headroom 1, but not for ever: after max(8, stall_window / 4) evaluations
    without an ok one the shape yields, while a measured shape keeps its headroom share."""
    from populations import Evaluation, Status

    archive_dir = tmp_path / "a"
    # min_evals 0: BIG's best time is set below without evaluations, and its headroom is the point
    cfg = merge({"allocation": {"stall_window": 40, "min_evals": 0}},
                {"shapes": [str(BIG), str(SMALL)], "archive": str(archive_dir), "progress": "none"})
    cands = [TEMPLATES["sm80_mma"].candidate(k, SMALL)
             for k in TEMPLATES["sm80_mma"].sample(__import__("random").Random(1), SMALL, 12)]
    with Archive(archive_dir, "w") as archive:
        engine = Engine(cfg, archive, FakeEvaluatorPool(delay_s=0.0), {}, TEMPLATES,
                        events=EventLog(archive_dir / EVENTS_FILE), calibration=_toy_calibration())
        assert engine.weights([BIG, SMALL]) == {BIG: 1.0, SMALL: 1.0}
        for i, c in enumerate(cands[:10]):
            engine.states[SMALL].observe(c, Evaluation(c.id, SMALL, Status.COMPILE_ERROR))
            assert engine.stalled(SMALL) is (i + 1 >= 10)
        assert engine.weights([BIG, SMALL]) == {BIG: 1.0, SMALL: 0.0}
        engine.states[BIG].best_time = 1.0  # BIG measured, far from its limit: it keeps its headroom share
        w = engine.weights([BIG, SMALL])
        assert w[SMALL] == 0.0 and w[BIG] == pytest.approx(0.99)
        engine.states[BIG].best_time = 1e-2  # BIG at its limit too: nobody has headroom, the shares are even again
        assert engine.weights([BIG, SMALL]) == {BIG: 1.0, SMALL: 1.0}
