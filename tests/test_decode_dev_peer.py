"""bench/decode_dev.py's plain peer at every M <= 16: the configurations it screens for hangs and skips.

The peer module here is a test double (an object with the real peer's two configuration lists and
a launcher factory that fails the test if called): the peer is not ours (../shared/peers/), and its
kernels need a GPU.
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from decode_dev import peer_best, peer_jobs, peer_name  # noqa: E402
from populations import Shape  # noqa: E402


def _peer() -> SimpleNamespace:
    def ours(*_a):  # any launch of a skipped configuration is a failure
        raise AssertionError("a skipped configuration was launched")
    return SimpleNamespace(CONFIGS=[(1, 4), (4, 8)], MMA_CONFIGS=[(1, 4), (2, 2)], ours=ours)


def test_jobs_cover_every_peer_row_and_configuration_by_the_screens_names() -> None:
    peer = _peer()
    shapes = [Shape.parse(t) for t in ("1x64x128", "3x406x12952", "16x4096x4096", "17x512x512", "2x100x1001")]
    jobs = peer_jobs(peer, shapes)
    # rows the peer runs: M <= 16 and K % 8 == 0 (17x512x512 and the ragged K are not)
    assert sorted({(m, n, k) for m, n, k, _ in jobs}) == [(1, 64, 128), (3, 406, 12952), (16, 4096, 4096)]
    assert [name for m, _, _, name in jobs if m == 3] == ["gemv<3,1,4>", "gemv<3,4,8>", "mma<1,1,4>", "mma<1,2,2>"]
    assert [name for m, _, _, name in jobs if m == 16][2:] == ["mma<2,1,4>", "mma<2,2,2>"]


def test_names_are_the_screen_childs() -> None:
    """The screen's child launches a job by the name _llm_timer.PeerRunner gives a configuration."""
    pytest.importorskip("torch")
    from _llm_timer import PeerRunner

    for cfg in (("gemv", 3, 1, 4), ("mma", 2, 4, 8)):
        assert peer_name(*cfg) == PeerRunner.name(*cfg)


def test_skipped_configurations_are_never_launched() -> None:
    peer = _peer()
    s = Shape.parse("3x406x12952")
    fns = {("gemv", 3, 1, 4): object(), ("gemv", 3, 4, 8): object(), ("mma", 1, 1, 4): object(), ("mma", 1, 2, 2): object()}
    skip = frozenset(peer_jobs(peer, [s]))
    assert peer_best(peer, fns, s, [], None, skip) == (None, "", None)
    assert peer_best(peer, fns, Shape.parse("3x406x12953"), [], None) == (None, "", None)  # ragged K: no peer
