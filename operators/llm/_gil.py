"""A short GIL switch interval while the model holds the GPU (issue 35's contention in held slices).

A forward pass of a small model is launch-bound: hundreds of torch ops, each releasing the GIL
and taking it back. When another thread of the engine's process is busy in Python (an operator
rendering or checking proposals, the ranker scoring), every take-back waits until that thread is
made to drop the GIL, which CPython asks for only after the switch interval (5 ms by default):
the convoy effect. One decoding step of the 135M model on the 2-core CPU machine took 57 ms alone,
7.4 s beside a thread spinning in Python and 224 ms with a 0.1-ms interval; beside a thread busy
half the time, 109 and 88 ms (``bench/gil_convoy_bench.py``, RESULTS section 24). A held slice is
charged to the model as GPU time, so the wait was charged too.

:func:`short_switch_interval` sets the interval to :data:`HELD_SWITCH_INTERVAL_S` for as long as
any slice is held (nested and concurrent holders count; the last one out restores what was
there), so the other threads still run, in shorter turns, while the model holds the GPU.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator, Optional

__all__ = ["HELD_SWITCH_INTERVAL_S", "short_switch_interval"]

#: The GIL switch interval while a slice is held (seconds).
HELD_SWITCH_INTERVAL_S = 1e-4

_lock = threading.Lock()
_holders = 0
_saved = 0.0


@contextlib.contextmanager
def short_switch_interval(interval_s: Optional[float] = None) -> Iterator[None]:
    """Hold the GIL switch interval at ``interval_s`` (default :data:`HELD_SWITCH_INTERVAL_S`, read
    at each call; never longer than it was) inside the block."""
    global _holders, _saved
    with _lock:
        if _holders == 0:
            _saved = sys.getswitchinterval()
            sys.setswitchinterval(min(HELD_SWITCH_INTERVAL_S if interval_s is None else interval_s, _saved))
        _holders += 1
    try:
        yield
    finally:
        with _lock:
            _holders -= 1
            if _holders == 0:
                sys.setswitchinterval(_saved)
