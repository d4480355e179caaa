"""The problems a generic candidate (one that claims every M, N and K) is checked on besides its
claimed shape: a cover of every alignment class, the small ranges and the sizes around the claim.

A dimension is *aligned* when it is a multiple of 8 (what vectorised loads, TMA pitches and
most tiles need) and *ragged* otherwise. the harness draws, deterministically from
its ``rng`` (a job's seed), :func:`class_cover` and :func:`ragged_instances` together:

- every one of the 8 combinations of aligned and ragged M, N and K in the small ranges (M in
  1..8, N and K below a tile: ragged M in 2..6, N in 2..12, K in 2..16) and again at mid sizes
  (72..384, ragged ones 1..7 past a multiple of 8): a kernel wrong only when M and N are
  aligned and K is ragged, or only for M in 2..6, meets its class twice;
- 1x1x1, one instance with residues 17..63 past a multiple of 64 (tails of big tiles) and one
  with K >= 4096 (the all-ones and cancellation probes);

and :func:`large_ragged` / :func:`beyond_claim` the claimed shape with every tail cut (the same
grid) and a size past the claim in every dimension (a generic claim admits it). Dimensions used
as a tensor-map row pitch stay multiples of 8 (TMA requires it): their ragged classes collapse
into the aligned ones. :func:`class_cover` draws the 16 class instances (at most
:data:`MAX_INSTANCES`, duplicates dropped; one random-input check each), :func:`ragged_instances`
the other three (a random-input and a planted-NaN check each): 19 small instances and 2
full-size ones per generic claim, against 6 and 1 before.
"""
from __future__ import annotations

import itertools
import random
from typing import Optional

from populations import Shape

__all__ = ["ragged_instances", "class_cover", "large_ragged", "beyond_claim", "alignment_class", "MAX_INSTANCES"]

#: Most instances :func:`class_cover` returns: the 8 alignment classes at two scales.
MAX_INSTANCES = 16

#: The small ragged values per dimension: M in 2..6, N in 2..12 and K in 2..16 (not multiples of 8).
_SMALL_RAGGED = {"m": list(range(2, 7)), "n": [d for d in range(2, 13) if d % 8], "k": [d for d in range(2, 17) if d % 8]}


def alignment_class(shape: Shape) -> tuple[bool, bool, bool]:
    """(M, N, K) each aligned (a multiple of 8) or not."""
    return shape.m % 8 == 0, shape.n % 8 == 0, shape.k % 8 == 0


def _pitched(shape: Shape, tma_pitch: set[str], m: int, n: int, k: int) -> Shape:
    if "K" in tma_pitch:
        k = -(-k // 8) * 8
    if "N" in tma_pitch:
        n = -(-n // 8) * 8
    return shape.with_dims(m, n, k)


def _small(dim: str, aligned: bool, rng: random.Random) -> int:
    if aligned:
        return 8 if dim != "k" else rng.choice((8, 16))
    return rng.choice(_SMALL_RAGGED[dim])


def _mid(aligned: bool, rng: random.Random) -> int:
    base = 8 * rng.randint(9, 48)
    return base if aligned else base + rng.randint(1, 7)


def ragged_instances(shape: Shape, tma_pitch: set[str], rng: Optional[random.Random] = None) -> list[Shape]:
    """1x1x1, with ``rng`` one instance with residues 17..63 past a multiple of 64 (the tails of
    big tiles), and 65x72x4104 (K >= 4096: the all-ones and cancellation probes), of ``shape``'s
    layout: the instances the harness runs its smoke checks on (random inputs and planted NaN)."""
    out = [_pitched(shape, tma_pitch, 1, 1, 1)]
    if rng is not None:
        out.append(_pitched(shape, tma_pitch, *(64 * rng.randint(1, 3) + rng.randint(17, 63) for _ in range(3))))
    return out + [_pitched(shape, tma_pitch, 65, 72, 4104)]


def class_cover(shape: Shape, tma_pitch: set[str], rng: Optional[random.Random] = None) -> list[Shape]:
    """The alignment-class cover of the module docstring for ``shape``'s layout (``rng``: the
    draw; a fixed seed without one): each of the 8 combinations of aligned and ragged M, N, K in
    the small ranges, then each again at mid sizes; duplicates dropped (pitch dimensions
    collapse classes). The harness runs one random-input check on each (judged by the stricter
    tolerance: every element compared)."""
    rng = rng or random.Random(0)
    out: list[Shape] = []
    for small in (True, False):
        for am, an, ak in itertools.product((True, False), repeat=3):
            dims = ((_small("m", am, rng), _small("n", an, rng), _small("k", ak, rng)) if small
                    else (_mid(am, rng), _mid(an, rng), _mid(ak, rng)))
            out.append(_pitched(shape, tma_pitch, *dims))
    seen: set[tuple[int, int, int]] = set()
    return [s for s in out if (s.m, s.n, s.k) not in seen and not seen.add((s.m, s.n, s.k))][:MAX_INSTANCES]


def large_ragged(shape: Shape, tma_pitch: set[str], rng: random.Random) -> Shape:
    """The claimed shape with ragged M, N and K tails: each dimension above 1 cut by 1..63 (at
    random), so the grid is as large as the claimed one (a kernel cannot tell a check by its
    size) and every edge tile and the K tail are partial. TMA pitch dimensions stay multiples of 8."""
    def cut(d: int, pitch: bool) -> int:
        if d <= 1:
            return d
        if pitch and d <= 8:
            return d  # a pitch must stay a multiple of 8: nothing smaller is left to cut to
        out = d - max(1, min(d - 1, rng.randint(1, 63)))
        return max(8, out // 8 * 8) if pitch else out
    return shape.with_dims(cut(shape.m, False), cut(shape.n, "N" in tma_pitch), cut(shape.k, "K" in tma_pitch))


def beyond_claim(shape: Shape, tma_pitch: set[str], rng: random.Random) -> Shape:
    """Past the claimed shape in every dimension by 1..63 (at random; TMA pitch dimensions by a
    multiple of 8): a generic claim admits it, and a kernel sized to the claimed grid (a fixed
    table, a fixed workspace) fails there."""
    def grow(d: int, pitch: bool) -> int:
        step = rng.randint(1, 63)
        return d + (-(-step // 8) * 8 if pitch else step)
    return shape.with_dims(grow(shape.m, False), grow(shape.n, "N" in tma_pitch), grow(shape.k, "K" in tma_pitch))
