"""Racing in the device timer (issue 36's throughput): a candidate that cannot become an elite
stops being timed once even its fastest call is far below the elite threshold. The rule
(``race_stop``) and the timer's bookkeeping (``_Race``, fed by event test doubles standing in for
CUDA events, a boundary we do not own) on the CPU; the timer on a real GPU, GPU-marked."""
from __future__ import annotations

import random

import pytest

from evaluators.run._gates import RACE_SHARE, race_stop
from populations import Shape

torch = pytest.importorskip("torch")


def _per_call(cand: list[float], base: float = 1e-3) -> dict[str, list[float]]:
    return {"candidate": cand, "torch.matmul NN": [base] * 3, "torch.matmul TN": [base * 1.2] * 3}


def test_no_threshold_or_race_off_never_stops():
    assert race_stop({}) is None
    assert race_stop({"elite_threshold": None}) is None
    assert race_stop({"elite_threshold": 0.9, "race": False}) is None
    shape = Shape.parse("64x128x64")
    assert race_stop({"elite_threshold": {"1x2x3:TN:f32": 0.9}}, shape) is None  # no cutoff known for this shape


def test_stops_only_when_even_the_fastest_call_is_below_the_cutoff():
    stop = race_stop({"elite_threshold": 1.0})
    assert stop is not None
    slow = 1e-3 / (RACE_SHARE * 0.9)  # speedup 0.9 x RACE_SHARE: below the cutoff
    assert stop(_per_call([slow, slow * 1.1, slow]))
    # one call fast enough to reach the cutoff keeps it in the race, however slow the others
    assert not stop(_per_call([slow, 1e-3 / (RACE_SHARE * 1.01), slow * 3]))
    assert not stop(_per_call([slow]))  # one sample is not enough
    assert not stop({"candidate": [slow, slow]})  # no baseline yet
    # the better baseline decides: against the slower one this candidate would pass
    assert stop({"candidate": [2e-3, 2e-3], "a": [1e-3] * 3, "b": [1.9e-3] * 3})


def test_per_shape_thresholds():
    shape = Shape.parse("64x128x64")
    stop = race_stop({"elite_threshold": {str(shape): 2.0}}, shape)
    assert stop is not None and stop(_per_call([1e-3, 1e-3]))  # speedup 1.0 < 0.8 x 2.0


class _FakeEvent:
    """A test double for ``torch.cuda.Event``: done or not, a fixed time in ms since an origin."""

    def __init__(self, ms: float, done: bool = True) -> None:
        self.ms, self.done = ms, done

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, end: "_FakeEvent") -> float:
        return end.ms - self.ms


def test_race_reads_completed_pairs_once_and_waits_for_min_rounds():
    from evaluators.run._timers import _Race

    seen: list[dict[str, list[float]]] = []

    def stop(per_call):
        seen.append({k: list(v) for k, v in per_call.items()})
        return len(per_call["cand"]) >= 3

    race = _Race({"cand": (None, 2), "base": (None, 4)}, min_rounds=2, stop=stop)
    events = {"cand": [(_FakeEvent(0), _FakeEvent(4))], "base": [(_FakeEvent(0), _FakeEvent(8))]}
    assert not race.done(1, events) and not seen  # before min_rounds: not even asked
    events["cand"].append((_FakeEvent(10), _FakeEvent(16, done=False)))  # not finished: not read yet
    assert not race.done(2, events)
    assert seen[-1] == {"cand": [2e-3], "base": [2e-3]}  # ms / calls per replay, in seconds
    events["cand"][1][1].done = True
    events["cand"].append((_FakeEvent(20), _FakeEvent(22)))
    assert race.done(3, events)
    assert seen[-1]["cand"] == pytest.approx([2e-3, 3e-3, 1e-3])


@pytest.mark.gpu
def test_device_timer_stops_a_slow_arm_early_on_the_gpu():
    """A candidate ten times slower than its baseline (the same product ten times over) is
    stopped after ``min_rounds`` when the stop rule says so, and timed in full without one."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from evaluators.run._timers import Arm, DeviceTiming, device_timer

    n_sets, m, n, k = 4, 1024, 1024, 1024
    a = torch.randn(n_sets, m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n_sets, k, n, device="cuda", dtype=torch.float16)
    c = torch.empty(n_sets, m, n, device="cuda", dtype=torch.float16)

    def slow(i: int) -> None:
        for _ in range(10):
            torch.matmul(a[i], b[i], out=c[i])
    arms = [Arm("candidate", slow, n_sets), Arm("base", lambda i: torch.matmul(a[i], b[i], out=c[i]), n_sets)]
    settings = DeviceTiming(rounds=12, min_rounds=3)
    full = device_timer(arms, settings=settings, rng=random.Random(0), perturb=lambda: None)
    assert full["candidate"].rounds == full["candidate"].planned == 12
    raced = device_timer(arms, settings=settings, rng=random.Random(0), perturb=lambda: None,
                         stop=race_stop({"elite_threshold": 0.5}))
    st = raced["candidate"]
    assert st.planned == 12 and 3 <= st.rounds < 12
    assert st.samples == 2 * st.rounds  # replays_per_round + 1 a round
    assert 5 < st.median / raced["base"].median < 20
    kept = device_timer(arms, settings=settings, rng=random.Random(0), perturb=lambda: None,
                        stop=race_stop({"elite_threshold": 0.05}))  # a threshold it meets: never stopped
    assert kept["candidate"].rounds == 12


@pytest.mark.gpu
def test_device_timer_says_where_its_rounds_went_on_the_gpu():
    """``TimerStats.loop`` (``LoopCost``): one replay counted per sample of every arm; a
    synchronisation before and after each host-synchronised replay (every round of every arm
    when there are at most HOST_SYNC_ROUNDS rounds) and one at the end; the perturbation's GPU
    time seen (a pass over 64 MB), and the host's parts within the rounds' wall time."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from evaluators.run._timers import HOST_SYNC_ROUNDS, Arm, DeviceTiming, device_timer

    n_sets, m = 4, 512
    a = torch.randn(n_sets, m, m, device="cuda", dtype=torch.float16)
    c = torch.empty_like(a)
    big = torch.zeros(32 << 20, device="cuda", dtype=torch.float16)
    arms = [Arm("candidate", lambda i: torch.matmul(a[i], a[i], out=c[i]), n_sets),
            Arm("base", lambda i: torch.matmul(a[i], a[i].t(), out=c[i]), n_sets)]
    rounds = min(6, HOST_SYNC_ROUNDS)
    notes: list[str] = []
    res = device_timer(arms, settings=DeviceTiming(rounds=rounds), rng=random.Random(1), perturb=lambda: big.add_(1),
                       on_replay=notes.append)
    loop = res["candidate"].loop
    assert loop == res["base"].loop  # one loop, all arms
    assert loop["replays"] == sum(st.samples for st in res.values()) == len(notes) == 2 * 2 * rounds
    assert loop["syncs"] == 2 * 2 * rounds + 1
    assert loop["perturb_gpu_s"] > 0 and loop["perturb_host_s"] > 0 and loop["note_host_s"] > 0
    host = sum(loop[k] for k in ("perturb_host_s", "note_host_s", "replay_host_s", "race_host_s", "sync_s"))
    assert 0 < host <= res["candidate"].sample_s
    plain = device_timer(arms, settings=DeviceTiming(rounds=rounds), rng=random.Random(1))
    assert plain["candidate"].loop["perturb_gpu_s"] == 0.0  # no perturbation: no event pairs around it

