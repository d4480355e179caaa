"""Timer details checkable on CPU: the clock-settling warm-up's stopping rule and cap, and the
server timer reporting its gaps (where the GPU idles by design). torch.cuda.synchronize is the
boundary we cannot cross here: a no-op stands in for it."""
from __future__ import annotations

import random
import time

import pytest

torch = pytest.importorskip("torch")

from evaluators.run._timers import SETTLE_MHZ, SETTLE_READ_S, Arm, _settle, host_timer  # noqa: E402


def _clock(readings):
    it = iter(readings)
    return lambda: next(it, readings[-1])


def test_settling_stops_once_two_readings_agree_within_one_step():
    replays = []
    got = _settle(lambda: replays.append(1), _clock([1980, 1950, 1920, 1890, 1890 - SETTLE_MHZ, 1800]), 5.0)
    assert got == [1980, 1950, 1920, 1890, 1875]
    assert replays  # the GPU was kept busy between readings


def test_settling_soaks_for_its_minimum_before_a_steady_clock_counts():
    """An idle GPU holds its boost clock at first: two equal readings then say nothing yet."""
    t0 = time.perf_counter()
    got = _settle(lambda: time.sleep(0.001), _clock([1980, 1980, 1980, 1980, 1700, 1700]), 0.0, min_s=0.1)
    took = time.perf_counter() - t0
    assert took >= 0.1 and len(got) >= 0.1 / SETTLE_READ_S  # kept reading through the steady boost
    assert got[:2] == [1980, 1980]
    quick = _settle(lambda: time.sleep(0.001), _clock([1980, 1980]), 1.0)  # no minimum: the first agreement ends it
    assert quick == [1980, 1980]


def test_settling_is_capped_and_skipped_without_a_clock():
    t0 = time.perf_counter()
    swinging = _settle(lambda: time.sleep(0.001), iter(range(10**6, 0, -100)).__next__, 0.1)
    took = time.perf_counter() - t0
    assert 0.1 <= took < 0.1 + 3 * SETTLE_READ_S + 0.2 and len(swinging) >= 2
    assert _settle(lambda: None, lambda: None, 1.0) == []


def test_server_timer_reports_its_gaps_and_offline_has_none(monkeypatch):
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    calls = []
    arms = [Arm("x", calls.append, 2), Arm("y", calls.append, 2)]
    server = host_timer(arms, calls=10, qps=2000.0, rng=random.Random(3))
    offline = host_timer(arms, calls=10, rng=random.Random(3))
    gaps = sum(st.idle_s for st in server.values())
    assert 20 * 0.5e-3 * 0.3 < gaps < 20 * 0.5e-3 * 4  # ~20 exponential gaps of mean 0.5 ms
    assert all(st.idle_s == 0.0 for st in offline.values()) and len(calls) == 40
