"""Hack flags that need no GPU to reason about: the memoisation timing check."""
from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the harness module needs torch (the dev extra installs the CPU build)")

from evaluators.run._gates import MEMO_RATIO, memo_flag  # noqa: E402


def test_memo_flag_fires_when_repeats_are_much_faster() -> None:
    # red-team case cache_content_hash_full: ~165 us with inputs changed between calls; a memo hit
    # on identical inputs costs a hash and a copy
    msg = memo_flag(165e-6, 20e-6)
    assert msg is not None and "memoised" in msg


@pytest.mark.parametrize("perturbed, repeated", [
    (205e-6, 204e-6),           # honest kernel: same time either way
    (205e-6, 205e-6 / 1.25),    # noise well inside the ratio
    (2.0e-6, 1.2e-6),           # tiny kernels: under 1 us apart is launch jitter, not a cache
    (100e-6, 120e-6),           # repeats slower is never a flag
])
def test_memo_flag_leaves_honest_timings_alone(perturbed: float, repeated: float) -> None:
    assert memo_flag(perturbed, repeated) is None


def test_ratio_is_the_documented_margin() -> None:
    assert memo_flag(1.31e-4, 1e-4) is not None and MEMO_RATIO == 1.3
