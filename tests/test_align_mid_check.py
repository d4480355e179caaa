"""bench/align_mid_check.py's variant lists (CPU): the ragged section times every sm90_wgmma pick
beside its twin that reads the ragged K the other way (in place with RAGGED, or staged), plus
in-place tiles that fit where the picks' own do not; NN and aligned shapes get no in-place variant."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from populations import Shape, load_templates  # noqa: E402


@pytest.fixture(scope="module")
def check():
    import align_mid_check
    return align_mid_check


@pytest.fixture(scope="module")
def templates():
    return load_templates()


def test_ragged_shapes_time_both_ways_of_reading_a_ragged_k(check, templates):
    shape = Shape.parse("22x6490x1001")  # a staged pick leads, an in-place pick follows it (K < 2048: no split-K lead)
    variants = check.ragged_variants(templates, shape)
    knobs = {label: c.knobs for label, c in variants if label.startswith("sm90_wgmma:")}
    assert knobs["sm90_wgmma:pick0"]["RAGGED"] == 0 and knobs["sm90_wgmma:pick1"]["RAGGED"] == 1
    # the in-place pick's tile is the staged lead's: each is the other's twin, timed once
    assert all(knobs["sm90_wgmma:pick1"][k] == knobs["sm90_wgmma:pick0"][k] for k in ("SWAP", "BM", "BN"))
    in_place = [label for label, k in knobs.items() if k["RAGGED"] == 1]
    assert any(label.startswith("sm90_wgmma:pick0-ip") for label in in_place)
    assert "sm90_wgmma:ip128x64s" in in_place
    for label, c in variants:  # every variant is valid at the shape (a twin that does not fit is left out)
        assert not templates[c.template].check(c.knobs, shape, 90), label


@pytest.mark.parametrize("text", ["300x1001x2050:NN", "4096x4096x4096"])
def test_no_in_place_variant_where_it_does_not_apply(check, templates, text):
    variants = check.ragged_variants(templates, Shape.parse(text))
    assert variants and not any(c.knobs.get("RAGGED") for _, c in variants)


def test_mid_grid_holds_swapped_split_k_tiles(check, templates):
    """M <= 512: the swapped tile with M in one or two tiles and K split 2-16, every one valid."""
    for text, width in (("176x4608x19456", 176), ("369x1072x17488", 192)):
        shape = Shape.parse(text)
        split = [(label, c) for label, c in check.mid_variants(templates, shape)
                 if c.knobs.get("SWAP") and c.knobs.get("SPLIT_K", 1) > 1]
        assert len(split) >= 3, text
        assert all(c.knobs["BN"] == width and c.knobs["EPI"] == "direct" for _, c in split)
        for label, c in split:
            assert not templates[c.template].check(c.knobs, shape, 90), label
