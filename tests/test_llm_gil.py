"""The short GIL switch interval inside the model's held slices (operators/llm/_gil.py): set for
as long as any slice is held, restored by the last holder, never lengthened; the transformers
backend's slices (ModelSteps._leased) take it."""
from __future__ import annotations

import sys
import threading

import pytest

from operators.llm._gil import HELD_SWITCH_INTERVAL_S, short_switch_interval


@pytest.fixture(autouse=True)
def _default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def test_set_inside_restored_after_and_nested() -> None:
    with short_switch_interval():
        assert sys.getswitchinterval() == pytest.approx(HELD_SWITCH_INTERVAL_S)
        with short_switch_interval():
            assert sys.getswitchinterval() == pytest.approx(HELD_SWITCH_INTERVAL_S)
        assert sys.getswitchinterval() == pytest.approx(HELD_SWITCH_INTERVAL_S)  # the outer one still holds it
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_restored_after_an_exception_and_never_lengthened() -> None:
    with pytest.raises(RuntimeError):
        with short_switch_interval():
            raise RuntimeError("a failed forward pass")
    assert sys.getswitchinterval() == pytest.approx(0.005)
    sys.setswitchinterval(1e-5)  # already shorter than a slice's: left as it is
    with short_switch_interval():
        assert sys.getswitchinterval() == pytest.approx(1e-5)
    assert sys.getswitchinterval() == pytest.approx(1e-5)


def test_concurrent_holders_restore_once_the_last_leaves() -> None:
    entered, release_first, release_second = threading.Event(), threading.Event(), threading.Event()
    seen = []

    def holder(first: bool) -> None:
        with short_switch_interval():
            if first:
                entered.set()
                release_first.wait(5)
            else:
                release_second.wait(5)
            seen.append(sys.getswitchinterval())

    a = threading.Thread(target=holder, args=(True,))
    a.start()
    assert entered.wait(5)
    b = threading.Thread(target=holder, args=(False,))
    b.start()
    release_first.set()  # the first holder leaves while the second still holds
    a.join(5)
    assert sys.getswitchinterval() == pytest.approx(HELD_SWITCH_INTERVAL_S)
    release_second.set()
    b.join(5)
    assert seen == [pytest.approx(HELD_SWITCH_INTERVAL_S)] * 2
    assert sys.getswitchinterval() == pytest.approx(0.005)


def test_the_backends_held_slice_takes_the_short_interval() -> None:
    from operators.llm._steps import ModelSteps

    steps = ModelSteps()
    steps.device = "cpu"
    with steps._leased():
        inside = sys.getswitchinterval()
    assert inside == pytest.approx(HELD_SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() == pytest.approx(0.005)
