"""Checks on the timing rotation's outputs (every set of a rotation at once): the rechecks after
timing (:func:`recheck_sets`) against a reference kept with the rotation
(:class:`RotationReference`), and the verification of chosen sets and rows (:func:`verify_sets`)."""
from __future__ import annotations

from typing import Callable, Optional

import torch

from ._probes import scramble_
from ._reference import _abs_fp16, _rss_fp16
from ._tolerance import FP64_LIMIT, CheckFailed, tolerance_strict


def recheck_sets(a3: torch.Tensor, b3: torch.Tensor, c3: torch.Tensor, layout: str, call: Callable[[int], None],
                 sync: Callable[[], None], gen: torch.Generator, passes: int = 3,
                 call_all: Optional[Callable[[], None]] = None,
                 base: Optional["RotationReference"] = None) -> None:
    """The after-timing check, on the timing rotation: state kept across calls must not matter.

    ``a3``/``b3``/``c3`` are the stacked sets (B as stored); ``call(i)`` runs the candidate on set
    ``i`` with the workspace the timed calls left behind (not re-filled). Each pass changes, *in
    place* in every set, a few rows of A and of B (pass 1), then 8 scattered single elements of
    each (pass 2, alone: a strided content hash misses 7 in 8), then scattered elements again, and
    the last set called twice back-to-back with scattered elements changed in between and C left
    holding the first call's (right) output, so a memo that trusts C must notice (pass 3). Not re-fills:
    caches keyed by pointers, by sampled or strided elements, or pre-packed B miss them. Every C
    is filled with finite garbage first (a kernel that trusts C or skips "already done" tiles
    leaves it there), every set is called back-to-back and every set verified. The inputs are
    restored afterwards (the rotation is reused). Raises :class:`CheckFailed` naming the set.

    ``call_all()``, when given, calls every set once in order (the harness replays the timer's
    captured one-rotation graph: one launch instead of thousands of eager calls at tiny shapes);
    the in-place changes are eager ops on the same stream, ordered before it.

    ``base``: the rotation's reference from its pristine inputs (:class:`RotationReference`,
    computed once per rotation, not per candidate); each pass then recomputes only the rows and
    columns its changes reach (see :func:`verify_sets`)."""
    saved: list[tuple[torch.Tensor, tuple, torch.Tensor]] = []

    def change(t3: torch.Tensor, index: tuple) -> None:
        saved.append((t3, index, t3[index].clone()))
        old = t3[index]
        fresh = torch.empty(old.shape, dtype=t3.dtype, device=t3.device).uniform_(-1, 1, generator=gen)
        t3[index] = scramble_(fresh, gen)  # drawn as every other input is (:func:`._probes.draw_random`)

    def pick(n: int, count: int) -> torch.Tensor:
        return torch.randperm(n, generator=gen, device=a3.device)[: max(1, min(count, n))]

    n_sets = a3.shape[0]
    check = "outputs after timing"

    def snapshot() -> list[torch.Tensor]:
        return [a3.view(torch.int16).clone(), b3.view(torch.int16).clone()]

    def unchanged(expect: list[torch.Tensor], p: int) -> None:
        """References come from a3/b3: they must still be what we wrote, bit for bit."""
        if not all(torch.equal(t.view(torch.int16), e) for t, e in zip((a3, b3), expect)):
            raise CheckFailed(check, f"pass {p + 1}: modified input A or B in place during calls after timing")
    try:
        for p, mode in enumerate(("rows", "elements", "repeat")[:passes]):
            for t3 in (a3, b3):
                rows, cols = t3.shape[1], t3.shape[2]
                if mode == "rows":
                    change(t3, (slice(None), pick(rows, max(1, min(3, rows // 4))), slice(None)))
                else:  # alone, so that no changed row forces the recompute a missed element needs
                    flat = torch.randint(0, rows * cols, (8,), generator=gen, device=t3.device)
                    change(t3, (slice(None), flat // cols, flat % cols))
            c3.uniform_(-4, 4, generator=gen)
            expect = snapshot()
            if call_all is not None:
                call_all()
            else:
                for i in range(n_sets):
                    call(i)
            if mode == "repeat":  # C now holds the right output: a memo that trusts it must see the change
                sync()
                unchanged(expect, p)
                for t3 in (a3, b3):
                    rows, cols = t3.shape[1], t3.shape[2]
                    flat = torch.randint(0, rows * cols, (8,), generator=gen, device=t3.device)
                    change(t3, (slice(n_sets - 1, n_sets), flat // cols, flat % cols))
                expect = snapshot()
                call(n_sets - 1)
            sync()
            unchanged(expect, p)
            verify_sets(a3, b3, c3, layout, check, f"pass {p + 1} ({mode} changed in place)", base=base)
    finally:
        for t3, index, old in reversed(saved):
            t3[index] = old


def _ref_dtype(m: int, n: int, k: int, device: torch.device) -> torch.dtype:
    """float64 up to :data:`FP64_LIMIT` multiply-adds (and on a CPU), float32 (TF32 off) above."""
    return torch.float64 if m * n * k <= FP64_LIMIT or device.type == "cpu" else torch.float32


class RotationReference:
    """The reference ``A[i]·B[i]`` of every set of a timing rotation, from its *pristine* inputs.

    The rotation's inputs are fixed for its lifetime (filled once from a seed, held bit-exact to
    a pristine copy between candidates), so the full-precision product, the costly part of
    verifying every set after timing, is the same for every candidate: it is computed once,
    here, from the pristine copies (never from buffers a candidate could reach), and
    :func:`verify_sets` recomputes only what a check changed. ``a_pristine`` (sets, m, k) and
    ``b_pristine`` (sets, n, k) fp16, B as N×K; the result is float64 or float32 as
    :func:`reference` would choose."""

    def __init__(self, a_pristine: torch.Tensor, b_pristine: torch.Tensor) -> None:
        sets, m, k = a_pristine.shape
        n = b_pristine.shape[1]
        self.a, self.b_nk = a_pristine, b_pristine
        self.dtype = dt = _ref_dtype(m, n, k, a_pristine.device)
        self.ref = torch.empty(sets, m, n, dtype=dt, device=a_pristine.device)
        chunk = _set_chunk(m, n)
        for lo in range(0, sets, chunk):
            torch.bmm(a_pristine[lo:lo + chunk].to(dt), b_pristine[lo:lo + chunk].to(dt).transpose(1, 2),
                      out=self.ref[lo:lo + chunk])

    def b_stored(self, layout: str) -> torch.Tensor:
        """The pristine B as stored for ``layout`` (a view: N×K, or K×N transposed)."""
        return self.b_nk if layout == "TN" else self.b_nk.transpose(1, 2)


def _set_chunk(m: int, n: int) -> int:
    """Sets per batched reference: about 256 MiB of float64 outputs at a time."""
    return max(1, (1 << 28) // max(1, m * n * 8))


def _changed_rows(cur: torch.Tensor, pristine: torch.Tensor) -> torch.Tensor:
    """Indices of the rows (dim 1) that differ bit for bit in any set (one sync)."""
    return (cur.view(torch.int16) != pristine.view(torch.int16)).any(dim=2).any(dim=0).nonzero().flatten()


def _reference_from_base(a: torch.Tensor, b: torch.Tensor, layout: str, base: RotationReference,
                         lo: int, hi: int) -> torch.Tensor:
    """The current product of sets ``lo:hi`` from the pristine one: rows of A that changed are
    recomputed; rows of B (as stored) that changed are recomputed as columns of C (TN: a row of
    B is a column of C) or, NN (a row of B is a k), added as the exact rank update
    ``A[:, k] (B - B0)[k, :]`` (float64 products of fp16 values and their differences). Every
    element not recomputed is the pristine reference of unchanged data."""
    dt = base.dtype
    ref = base.ref[lo:hi].clone()
    b0 = base.b_stored(layout)[lo:hi]
    rows_a = _changed_rows(a, base.a[lo:hi])
    rows_b = _changed_rows(b, b0)
    b_kn = (b.transpose(1, 2) if layout == "TN" else b).to(dt)
    if rows_b.numel() and layout == "NN":
        delta = b[:, rows_b, :].double() - b0[:, rows_b, :].double()
        ref += torch.bmm(a[:, :, rows_b].double(), delta).to(dt)
    elif rows_b.numel():
        ref[:, :, rows_b] = torch.bmm(a.to(dt), b_kn[:, :, rows_b])
    if rows_a.numel():
        ref[:, rows_a, :] = torch.bmm(a[:, rows_a, :].to(dt), b_kn)
    return ref


def verify_sets(a3: torch.Tensor, b3: torch.Tensor, c3: torch.Tensor, layout: str, check: str, where: str,
                what: str = "is wrong after calls that followed the timed ones", set_ids: Optional[list[int]] = None,
                row_ids: Optional[list[int]] = None, base: Optional[RotationReference] = None,
                exact_rows: Optional[torch.Tensor] = None) -> None:
    """Every set of a rotation: ``C[i] == A[i]·B[i]`` within the stricter of the random-input and
    exact tolerances (:func:`tolerance_strict`: an fp32 accumulation meets both on any data, so
    the cancellation hidden in timed inputs is judged exactly), else
    :class:`CheckFailed` naming the set and ``where`` (``b3`` as stored for ``layout``).
    ``set_ids``/``row_ids``: the sets' and rows' numbers in the rotation when ``a3``/``c3`` hold
    only some of them (for the message). ``base``: the whole rotation's pristine reference
    (:class:`RotationReference`; ``a3``/``b3`` are then every set of it): the reference is that
    one with what changed recomputed (:func:`_reference_from_base`), not a full product.
    ``exact_rows`` (sets x M, bool): rows that carry the hidden cancellation test
    (:func:`._probes.embed_cancellation`), judged by the exact tolerance alone: their partial sums
    reach half of ``S``, where the random-input tolerance does not bound an honest fp32 sum."""
    n_sets, m, k = a3.shape
    n = c3.shape[2]
    dt = _ref_dtype(m, n, k, a3.device)
    chunk = _set_chunk(m, n)
    for lo in range(0, n_sets, chunk):
        b = b3[lo:lo + chunk]
        b_kn = b.transpose(1, 2) if layout == "TN" else b
        if base is not None:
            ref = _reference_from_base(a3[lo:lo + chunk], b, layout, base, lo, lo + chunk)
        else:
            ref = torch.bmm(a3[lo:lo + chunk].to(dt), b_kn.to(dt))
        if a3.is_cuda:
            rss, sabs = _rss_fp16(a3[lo:lo + chunk], b_kn), _abs_fp16(a3[lo:lo + chunk], b_kn)
        else:
            a, bk = a3[lo:lo + chunk].to(dt), b_kn.to(dt)
            rss, sabs = torch.bmm(a * a, bk * bk).sqrt(), torch.bmm(a.abs(), bk.abs())
        c = c3[lo:lo + chunk]
        tol = tolerance_strict(ref, rss, sabs, k, None if exact_rows is None else exact_rows[lo:lo + chunk, :, None])
        bad = ~((c.to(dt) - ref).abs() <= tol)
        if bool(bad.any()):
            idx = bad.flatten().nonzero()[0].item()
            s, rem = divmod(idx, m * n)
            i, j = divmod(rem, n)
            set_no = set_ids[lo + s] if set_ids else lo + s
            row_no = row_ids[i] if row_ids else i
            raise CheckFailed(check, f"{where}: rotation set {set_no} {what} "
                                     f"({int(bad.sum())} bad elements; C[{row_no},{j}] = {float(c[s, i, j])!r} vs "
                                     f"{float(ref[s, i, j]):.6g}): state kept across calls, or stale/trusted outputs")
