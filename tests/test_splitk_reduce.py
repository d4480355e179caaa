"""The shared split-K reduce (``populations/templates/_prelude/splitk_reduce.cuh``) in the two
mma.sync families that use it beside sm90_wgmma (whose own cases live in test_template_sm90.py).

The reduce takes an 8-lane path where SPLIT_K >= 8 (derived SK_LANES): lanes sum every 8th slice
and meet in shared memory. The cases below cover SPLIT_K not a multiple of 8, C with 1-3 trailing
elements past a multiple of 4, a C smaller than one reduce block, and the 1-lane path beside it."""
from __future__ import annotations

import pytest

from populations import Shape, load_template
from populations._template import TEMPLATES_DIR

CASES = {
    "tiny": [("103x125x16768", {"TM": 32, "TN": 32, "WARPS": 4, "KU": 2, "SPLIT_K": 16}),
             ("5x7x9000", {"TM": 16, "TN": 8, "WARPS": 2, "KU": 1, "SPLIT_K": 8}),
             ("118x96x16384", {"TM": 64, "TN": 32, "WARPS": 4, "KU": 2, "SPLIT_K": 64}),
             ("33x47x2056", {"TM": 32, "TN": 16, "WARPS": 4, "KU": 1, "SPLIT_K": 4})],
    "sm80_mma": [("103x125x16768", {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "STAGES": 4,
                                    "SPLIT_K": 12}),
                 ("118x96x16384", {"BM": 64, "BN": 64, "BK": 64, "WM": 32, "WN": 32, "STAGES": 3,
                                   "SPLIT_K": 24}),
                 ("77x4099x4096:NN", {"BM": 128, "BN": 128, "BK": 32, "WM": 64, "WN": 64, "STAGES": 4,
                                      "SPLIT_K": 8}),
                 ("129x257x520", {"BM": 64, "BN": 64, "BK": 32, "WM": 32, "WN": 32, "STAGES": 3,
                                  "SPLIT_K": 3})],
}


def _cases():
    """``(template, shape, knobs)`` for every case."""
    return [(load_template(TEMPLATES_DIR / name), Shape.parse(shape), knobs)
            for name, cases in CASES.items() for shape, knobs in cases]


def _candidates():
    return [tpl.candidate(knobs, shape) for tpl, shape, knobs in _cases()]


def test_the_cases_are_valid_candidates_with_the_lanes_their_split_asks_for() -> None:
    """Every case builds (constraints hold), and its reduce launch has 8 lanes exactly where
    SPLIT_K >= 8: a case list that drifted out of the knob space would skip the path it names."""
    cands = _candidates()
    assert len(cands) == sum(len(c) for c in CASES.values())
    lanes = [tpl.space.env(knobs, shape)["SK_LANES"] for tpl, shape, knobs in _cases()]
    want = [8 if knobs["SPLIT_K"] >= 8 else 1 for _, _, knobs in _cases()]
    assert lanes == want
    assert lanes.count(8) >= 5 and lanes.count(1) >= 2


@pytest.mark.gpu
@pytest.mark.timeout(600)
def test_split_k_reduce_is_correct_in_the_mma_sync_families_on_the_gpu(tmp_path) -> None:
    pytest.importorskip("torch")
    from gpu_eval_all_ok import assert_all_ok

    assert_all_ok(_candidates(), tmp_path)
