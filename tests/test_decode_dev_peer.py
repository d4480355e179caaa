"""bench/decode_dev.py's plain peer at every M <= 16: the configurations it screens for hangs and skips.

The peer module here is a test double (an object with the real peer's two configuration lists, a
build that returns a stand-in kernel per configuration and a launcher factory that records every
launch): the peer is not ours (../shared/peers/), and its kernels need a GPU. It goes through
bench/_llm_timer.PeerRunner, whose configurations and names the screen's child uses too.
"""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

pytest.importorskip("torch")

from _llm_timer import PeerRunner  # noqa: E402
from decode_dev import peer_best, peer_jobs  # noqa: E402
from populations import Shape  # noqa: E402

CONFIGS, MMA_CONFIGS = [(1, 4), (4, 8)], [(1, 4), (2, 2)]


def _runner(ms: list[int]) -> tuple[PeerRunner, list]:
    launched: list = []

    def build(ms: list[int]) -> dict:
        return {c: object() for m in ms for c in [("gemv", m, r, w) for r, w in CONFIGS]
                + [("mma", (m + 7) // 8, r, w) for r, w in MMA_CONFIGS]}

    def ours(*args):
        launched.append(args)
        return lambda a, w, c: None
    peer = SimpleNamespace(CONFIGS=CONFIGS, MMA_CONFIGS=MMA_CONFIGS, build=build, ours=ours)
    return PeerRunner(peer, ms), launched


def test_jobs_cover_every_peer_row_and_configuration_by_the_screens_names() -> None:
    runner, _ = _runner([1, 3, 16])
    shapes = [Shape.parse(t) for t in ("1x64x128", "3x406x12952", "16x4096x4096", "17x512x512", "2x100x1001")]
    jobs = peer_jobs(runner, shapes)
    # rows the peer runs: M <= 16 and K % 8 == 0 (17x512x512 and the ragged K are not)
    assert sorted({(m, n, k) for m, n, k, _ in jobs}) == [(1, 64, 128), (3, 406, 12952), (16, 4096, 4096)]
    assert [name for m, _, _, name in jobs if m == 3] == ["gemv<3,1,4>", "gemv<3,4,8>", "mma<1,1,4>", "mma<1,2,2>"]
    assert [name for m, _, _, name in jobs if m == 16][2:] == ["mma<2,1,4>", "mma<2,2,2>"]
    # the screen's child launches a job by its name through the same runner: every name resolves
    for _, _, _, name in jobs:
        runner.launch_of(name)


def test_skipped_configurations_are_never_launched() -> None:
    runner, launched = _runner([3])
    s = Shape.parse("3x406x12952")
    skip = frozenset(peer_jobs(runner, [s]))
    assert len(skip) == 4
    assert peer_best(runner, s, [], None, skip) == (None, "", None)
    assert peer_best(runner, Shape.parse("3x406x12953"), [], None) == (None, "", None)  # ragged K: no peer
    assert peer_best(None, s, [], None) == (None, "", None)  # no peer file
    assert launched == []


def test_gemv_picks_of_three_tokens_are_timed_beside_their_power_of_two_twin() -> None:
    """decode_dev's variants: at M = 3 every gemv first pick of all tokens holds TOK 3 and comes with a twin at TOK 4
    (origin tokpow2: the count the picks held before TOK took every value), so one run settles TOK = M;
    M = 2 and 4 picks get none, and the grid holds TOK = M only."""
    from decode_dev import grid, variants
    from populations import load_templates

    templates = load_templates(errors="warn")
    rows = variants(Shape.parse("3x1232x2400"), templates, 8, 0, n_picks=3)
    picks = [k for n, k, o in rows if n == "gemv" and o.startswith("heuristic") and k["TOK"] != 1]
    twins = [k for n, k, o in rows if n == "gemv" and o == "tokpow2"]
    assert picks and all(k["TOK"] == 3 for k in picks)
    assert [dict(k, TOK=4) for k in picks] == twins
    assert {k["TOK"] for k in grid("gemv", Shape.parse("3x1232x2400"))} == {3}
    for text in ("2x1232x2400", "4x1232x2400"):
        assert not [o for n, _, o in variants(Shape.parse(text), templates, 8, 0, n_picks=3) if o == "tokpow2"]


def test_gemv_is_timed_at_the_peers_launch_shapes() -> None:
    """Beside the thinned grid, gemv runs at the plain peer's winning launch shapes (1-2 rows a CTA,
    2-8 warps, all tokens, the plain loop, no cluster: origin peershape), each once, so the two
    kernels meet at one launch shape; none under --picks-only."""
    from decode_dev import variants
    from populations import load_templates

    templates = load_templates(errors="warn")
    rows = variants(Shape.parse("3x1232x2400"), templates, 8, 0, n_picks=3)
    shapes = [k for n, k, o in rows if n == "gemv" and "peershape" in o.split("+")]
    assert len(shapes) == 12 and all(k["TOK"] == 3 and k["PIPE"] == 0 and k["CLUSTER"] == 1 for k in shapes)
    assert {(k["ROWS"], k["WARPS"]) for k in shapes} == {(r, w) for r in (1, 2) for w in (2, 4, 8)}
    keys = [tuple(sorted(k.items())) for n, k, _ in rows if n == "gemv"]
    assert len(keys) == len(set(keys))
    # past 8 tokens (gemv applies up to M 12 on few rows and deep K) the tokens in the fewest groups
    nine = variants(Shape.parse("9x264x3080"), templates, 8, 0, n_picks=3)
    shapes = [k for n, k, o in nine if n == "gemv" and "peershape" in o.split("+")]
    assert len(shapes) == 12 and all(k["TOK"] == 5 for k in shapes)
    quick = variants(Shape.parse("3x1232x2400"), templates, 8, 0, picks_only=True, n_picks=3)
    assert not [o for _, _, o in quick if "peershape" in o]
