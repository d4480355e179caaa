"""Inputs that checked and timed calls share, so that a kernel cannot tell one from the other.

- :func:`scramble_`: XOR every fp16 of a tensor with random bits in :data:`SCRAMBLE_MASK` (the
  sign, the two lowest exponent bits and the mantissa). Dense and unstructured: every element
  changes by an amount (sign, magnitude within a factor of 4, digits) that only a full product
  can account for, so no output kept from an earlier call can be updated cheaply. Bounded:
  values below 1 in magnitude stay below 2 (the exponent's high bits never change), and an XOR
  is its own inverse. The checked calls' random inputs are drawn the same way
  (:func:`draw_random`), the timed calls' perturbation applies it to the rotation between
  replays (``evaluators.run._rotation``).
- :func:`embed_cancellation`: an exact cancellation test hidden in such data. For a random
  subset of rows of A, the first half of k carries sign-coherent products (``sign(a_ik b_kj) =
  s_i u_j``) and every one of those k has a partner in the second half whose B row is the same
  and whose A element is the negation: those rows of C are exactly 0 while the partial sums
  reach about half of ``sum_k |a_ik b_kj|``. Magnitudes stay those of :func:`draw_random` (no
  value above 2, nothing integral), positions are drawn per call. An fp16 partial, a
  reduced-precision path or a low-precision accumulator off that path loses the
  cancellation; the exact tolerance sees it.
- :func:`poison_`: what C holds before a checked call, drawn per call: NaN, or finite values of
  an output's size (as a timed call's C holds the previous replay's outputs), so a kernel cannot
  tell a checked call by its poison; timed replays get the same poison on random sets.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

__all__ = ["SCRAMBLE_MASK", "scramble_", "scramble_mask", "draw_random", "embed_cancellation", "CancellationDraws",
           "cancellation_draws", "POISONS", "poison_"]

#: Bits of an fp16 that :func:`scramble_` draws: sign (15), the two lowest exponent bits (10, 11)
#: and the mantissa (0..9). A value below 1 in magnitude has exponent field <= 14, whose high
#: bits (12..14) stay: it stays below 2 and never becomes inf or NaN.
SCRAMBLE_MASK = 0x8FFF


def scramble_mask(numel: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``numel`` random int16 words restricted to :data:`SCRAMBLE_MASK` (the rotation keeps one
    such buffer and XORs windows of it at random offsets: one elementwise kernel per operand)."""
    words = torch.randint(-(1 << 15), 1 << 15, (numel,), dtype=torch.int16, generator=gen, device=device)
    return words.bitwise_and_(_signed16(SCRAMBLE_MASK))


def _signed16(v: int) -> int:
    return v - (1 << 16) if v >= 1 << 15 else v


def scramble_(t: torch.Tensor, gen: Optional[torch.Generator] = None, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """XOR every element of fp16 ``t`` (contiguous) with ``mask`` (int16 words of
    :data:`SCRAMBLE_MASK` bits: as many as ``t`` has, or as its last dimension has, the same
    for every row), or with fresh ones from ``gen``; in place."""
    bits = t.view(torch.int16)
    if mask is None:
        mask = scramble_mask(t.numel(), gen, t.device)
    return bits.bitwise_xor_(mask.view(bits.shape) if mask.numel() == bits.numel() else mask).view(torch.float16)


def draw_random(rows: int, cols: int, gen: torch.Generator, device: torch.device, lo: float = -1.0,
                hi: float = 1.0) -> torch.Tensor:
    """A checked call's random operand: uniform in (``lo``, ``hi``), then :func:`scramble_`d, so it
    has the distribution of a timed call's inputs (the rotation is uniform in (-1, 1), scrambled
    before every replay)."""
    t = torch.empty(rows, cols, dtype=torch.float16, device=device).uniform_(lo, hi, generator=gen)
    return scramble_(t, gen)


_PLUS_MINUS: dict[torch.device, torch.Tensor] = {}


def _signs(n: int, gen: torch.Generator, device: torch.device) -> torch.Tensor:
    """``n`` random signs (fp16 -1 or 1). On a GPU one draw and one lookup (two launches, not
    four); on the host arithmetic instead of the lookup: a host index of a few thousand elements
    runs on torch's intra-op thread pool, and on a machine whose cores are busy (compiler
    children beside the GPU worker) waiting for those threads cost 1.4 ms a call (issue 36)."""
    bits = torch.randint(0, 2, (n,), generator=gen, device=device)
    if device.type == "cpu":
        return bits.mul_(2).sub_(1).to(torch.float16)
    table = _PLUS_MINUS.get(device)
    if table is None:
        table = _PLUS_MINUS[device] = torch.tensor([-1.0, 1.0], dtype=torch.float16, device=device)
    return table[bits]


def _carrying(m: int, rows: Optional[int]) -> int:
    """How many rows of A carry the hidden test: ``rows`` within 1..M, else a quarter of M (at least 1)."""
    return max(1, m // 4) if rows is None else max(1, min(rows, m))


class CancellationDraws(NamedTuple):
    """One hidden test's random draws, on the operands' device: the partners' permutation of
    ``h = K // 2`` (``perm``), the signs ``t`` (``h``) and ``u`` (``N``), the carrying rows of A
    (``picked``) and their signs (``s``)."""

    perm: torch.Tensor
    t: torch.Tensor
    u: torch.Tensor
    picked: torch.Tensor
    s: torch.Tensor


def cancellation_draws(m: int, n: int, k: int, gen: torch.Generator, copies: int,
                       rows: Optional[int] = None) -> list[CancellationDraws]:
    """``copies`` independent draws for :func:`embed_cancellation` at M x N x K, all made at once
    where ``gen`` lives (a GPU generator: six launches for all of them; permutations as the
    argsort of uniform keys). The timers draw a few per candidate before its timed replays and
    hide the test with one drawn at random each time (:func:`evaluators.run._rotation._perturber`):
    drawing per call cost about fifteen launches, or host work that waits on busy cores, between
    timed replays. ``rows``: as for :func:`embed_cancellation`."""
    h = k // 2
    count = _carrying(m, rows)
    at = gen.device
    perm = torch.rand(copies, h, generator=gen, device=at).argsort(dim=1)
    picked = torch.rand(copies, m, generator=gen, device=at).argsort(dim=1)[:, :count]
    signs = torch.randint(0, 2, (copies, h + n + count), generator=gen, device=at, dtype=torch.float16)
    signs.mul_(2).sub_(1)
    return [CancellationDraws(perm[i], signs[i, :h], signs[i, h:h + n], picked[i], signs[i, h + n:])
            for i in range(copies)]


def embed_cancellation(a: torch.Tensor, b_kn: torch.Tensor, gen: Optional[torch.Generator] = None,
                       rows: Optional[int] = None, draws: Optional[CancellationDraws] = None) -> torch.Tensor:
    """Hide the cancellation test (module docstring) in ``a`` (..., M, K) and ``b_kn`` (..., K, N),
    in place (leading dimensions: rotation sets, all given the same positions); returns the rows
    of A that carry it (their outputs are exactly 0 up to an odd K's last term). ``rows``: how
    many (default a quarter of M, at least 1). Nothing for K < 2.

    Every write is a slice along K or a whole row of A, in the operand's own memory order (B as
    stored, N x K for TN, whose ``b_kn`` is a transposed view): the partners' permutation is
    applied by copying the coherent half into index positions along K in that order
    (``index_copy_``), never by scattering along a strided dimension (at 4096^3 a scatter
    through the transposed view cost milliseconds). The timers call this between replays, so
    its host cost counts: about a dozen launches, the signs applied in place.

    ``gen`` on the CPU with ``a`` on a GPU: the draws (two permutations and three sets of signs,
    in the same order) are made on the host and reach the device in two asynchronous copies from
    pinned memory, instead of about fifteen launches of device permutations (sorts) and sign
    lookups. The timers drew this way per hiding until they moved to ``draws`` made once per
    candidate (host draws waited on busy cores in the GPU worker, issue 36);
    ``bench/perturb_profile.py`` still times both.

    ``draws``: made before (:func:`cancellation_draws`, same M, N, K and ``rows``), instead of
    ``gen``'s: a dozen launches and no draw at all."""
    m, k = a.shape[-2], a.shape[-1]
    n = b_kn.shape[-1]
    dev = a.device
    h = k // 2
    if h < 1:
        return torch.empty(0, dtype=torch.long, device=dev)
    if draws is None:
        if gen is None:
            raise ValueError("embed_cancellation needs gen or draws")
        draws = CancellationDraws(*_draws(h, n, m, _carrying(m, rows), gen, dev))
    perm, t, u, picked, s = draws
    k_fast = b_kn.dim() >= 2 and b_kn.stride(-2) == 1 and n > 1  # B stored N x K: work on that view
    bs = b_kn.transpose(-1, -2) if k_fast else b_kn  # K on dim kd
    kd = -1 if k_fast else -2
    head = bs.narrow(kd, 0, h)
    head.abs_().mul_(t if k_fast else t[:, None]).mul_(u[:, None] if k_fast else u)  # sign(b_kj) = t_k u_j
    bs.narrow(kd, h, h).index_copy_(kd, perm, head)
    lead = a[..., picked, :h].abs_().mul_(s[:, None]).mul_(t)
    a[..., picked, :h] = lead
    a[..., picked, h:2 * h] = torch.empty_like(lead).index_copy_(-1, perm, lead.neg_())
    return picked


def _draws(h: int, n: int, m: int, count: int, gen: torch.Generator, dev: torch.device
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The hidden test's draws, in this order: the partners' permutation of ``h``, the signs
    ``t`` (``h``) and ``u`` (``n``), the carrying rows (``count`` of a permutation of ``m``)
    and their signs; made where ``gen`` lives and moved to ``dev`` (see
    :func:`embed_cancellation`)."""
    at = gen.device
    perm = torch.randperm(h, generator=gen, device=at)  # the partner of k < h is h + perm[k]
    t, u = _signs(h, gen, at), _signs(n, gen, at)
    picked = torch.randperm(m, generator=gen, device=at)[:count]
    s = _signs(count, gen, at)
    if at.type != "cpu" or dev.type == "cpu":  # drawn where they are used
        return perm, t, u, picked, s
    index = torch.cat([perm, picked]).pin_memory().to(dev, non_blocking=True)
    signs = torch.cat([t, u, s]).pin_memory().to(dev, non_blocking=True)
    return index[:h], signs[:h], signs[h:h + n], index[h:], signs[h + n:]


#: What C is poisoned with before a call: NaN (a kernel that leaves an element unwritten leaves
#: NaN), or finite values of an output's size (what a timed call's C holds: the last outputs).
POISONS = ("nan", "finite")


def poison_(c: torch.Tensor, kind: str, gen: torch.Generator, k: int) -> None:
    """Fill ``c`` with the poison ``kind`` (one of :data:`POISONS`): finite values are uniform
    within the typical output magnitude of scrambled inputs at ``k`` (about sqrt(K)/2), never an
    element's right value but for a negligible chance, so an unwritten C fails the value check
    instead of the NaN one."""
    if kind == "nan":
        c.fill_(float("nan"))
    elif kind == "finite":
        scale = max(1.0, 0.5 * k ** 0.5)
        c.uniform_(-scale, scale, generator=gen)
    else:
        raise ValueError(f"unknown poison {kind!r}")
