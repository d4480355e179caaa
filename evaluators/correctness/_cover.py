"""The class-cover instances of a generic claim, checked together: one block, one synchronisation.

A generic candidate is checked on :func:`._instances.class_cover`'s 16 small and mid instances
(every aligned/ragged combination of M, N and K) with one random-input check each. Checked one by
one (:class:`._correctness.Cascade`), each instance cost about 2 ms: its own four guarded blocks,
about 90 small launches of canaries, fills, guards, reference and comparison, and two
synchronisations, for a kernel call of a few microseconds (issue 36: +39 ms a candidate at
4096^3). :func:`check_cover` makes the same checks on all of them at once:

- **One block**, from the harness's allocator (a VA reservation whose unmapped gaps fault on far
  stores), holding every instance's A, B (as stored for the layout), C and workspace window.
  Each window sits behind a canary of ``guard_bytes`` plus a random number of 256-byte steps;
  the instances alternate (from a random start) between windows on 2 MiB boundaries and windows
  at those random offsets, as :meth:`._buffers.Operands.place` alternates placements.
- **The same inputs and poisons**: the whole block is random bytes, the inputs are drawn as
  every random-looking input is (:func:`._probes.draw_random`), each C gets a poison drawn per
  instance (:func:`._probes.poison_`, NaN or finite), each workspace a byte drawn as for the
  timed calls (zero where the plan zeroes it).
- **One snapshot, one comparison**: after the fills the block is copied; after every call (in a
  random order) one comparison of the block with the copy, blind only to the C and workspace
  windows, finds a store into any canary or any input ("wrote outside", "modified input").
- **One batched reference**: the instances' operands are zero-padded into one batch and
  :func:`._reference.reference_scales` gives R, T and S for all; each output is judged by the
  stricter tolerance (:func:`._tolerance.tolerance_strict`, every element), as
  :meth:`Cascade.random` judges it. The verdicts, error maxima and the comparison come back in
  one ``tolist()``.

What checking them one by one saw and this does not: a store that skips the canary behind a
window (``guard_bytes`` and more) and lands in another instance's output window is seen only
where it breaks that instance's values (the order of calls is random), and one that lands in
another instance's workspace window not at all (a workspace is the kernel's to write); one by
one, in separate reservations, both faulted. Every other stray store is seen, one past the block
faults as before, and the claimed shape and the other instances keep their own reservations.
Only a failure takes the slow path that locates it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from populations import Shape

from ._buffers import PLACEMENT_ALIGN, workspace_fill
from ._correctness import value_failure
from ._probes import POISONS, draw_random, poison_
from ._reference import reference_scales
from ._tolerance import CheckFailed, tolerance_strict

__all__ = ["CoverItem", "CoverOperands", "check_cover", "COVER_CHECK", "COVER_BLOCK_STEP"]

#: The check's name, as :meth:`Cascade.random` names its own (a kernel cannot tell them apart).
COVER_CHECK = "random inputs"

#: The block's size is rounded up to this many bytes, so that jobs of a worker reuse it (the
#: allocator reuses blocks of the same size).
COVER_BLOCK_STEP = 16 << 20

#: Random extra canary behind a window: up to this many bytes, in 256-byte steps.
_JITTER = 256 << 10


class _Window:
    """One operand's bytes inside the block: ``data`` (a typed view) and its address."""

    def __init__(self, block: torch.Tensor, offset: int, rows: int, cols: int, dtype: torch.dtype) -> None:
        esize = 2 if dtype is torch.float16 else 1
        self.lo, self.hi = offset, offset + rows * cols * esize
        self.data = block[self.lo:self.hi].view(dtype).view(rows, cols)
        self.ptr = block.data_ptr() + offset


@dataclass
class CoverOperands:
    """What a stand-in or the harness's call sees of one instance (the shape of
    :class:`._buffers.Operands`: ``A``, ``B``, ``C``, ``W`` with ``.data``, and :meth:`pointers`)."""

    shape: Shape
    A: _Window
    B: _Window
    C: _Window
    W: _Window
    workspace_bytes: int
    zero_workspace: bool

    def pointers(self) -> dict[str, int]:
        return {"A": self.A.ptr, "B": self.B.ptr, "C": self.C.ptr, "workspace": self.W.ptr}

    def b_kn(self) -> torch.Tensor:
        """B as the K x N operand of the product (a view)."""
        return self.B.data.t() if self.shape.layout == "TN" else self.B.data


@dataclass(frozen=True)
class CoverItem:
    """One instance: its shape, its workspace bytes and the candidate's call on its operands."""

    shape: Shape
    workspace_bytes: int
    call: Callable[[CoverOperands], None]


@dataclass(frozen=True)
class CoverResult:
    """The checks made (one :data:`COVER_CHECK` an instance) and the largest error seen."""

    checks: tuple[str, ...]
    max_error: float


def _layout(items: Sequence[CoverItem], base: int, guard_bytes: int, rng: random.Random,
            aligned_first: bool) -> tuple[list[list[tuple[int, int, int, torch.dtype]]], int]:
    """Per instance, (offset, rows, cols, dtype) of A, B, C, W; and the bytes the layout takes."""
    out, at = [], 0
    for i, it in enumerate(items):
        s = it.shape
        b_rows, b_cols = (s.n, s.k) if s.layout == "TN" else (s.k, s.n)
        aligned = (i % 2 == 0) == aligned_first
        wins = []
        for rows, cols, dtype in ((s.m, s.k, torch.float16), (b_rows, b_cols, torch.float16),
                                  (s.m, s.n, torch.float16), (1, max(it.workspace_bytes, 256), torch.uint8)):
            at += guard_bytes + 256 * rng.randrange(_JITTER // 256)
            if aligned:
                at = -(-(base + at) // PLACEMENT_ALIGN) * PLACEMENT_ALIGN - base
            at = -(-(base + at) // 256) * 256 - base  # addresses 256-byte aligned, as the harness's always are
            wins.append((at, rows, cols, dtype))
            at += rows * cols * (2 if dtype is torch.float16 else 1)
        out.append(wins)
    return out, at + guard_bytes


def _bytes_needed(items: Sequence[CoverItem], guard_bytes: int) -> int:
    """An upper bound on :func:`_layout`'s size at any base: every window behind its largest
    canary and a whole alignment step."""
    total = guard_bytes
    for it in items:
        s = it.shape
        total += 4 * (guard_bytes + _JITTER + PLACEMENT_ALIGN + 256)
        total += 2 * (s.m * s.k + s.k * s.n + s.m * s.n) + max(it.workspace_bytes, 256)
    return -(-total // COVER_BLOCK_STEP) * COVER_BLOCK_STEP


def check_cover(items: Sequence[CoverItem], zero_workspace: bool, device: torch.device, gen: torch.Generator,
                rng: random.Random, sync: Callable[[], None], guard_bytes: int = 1 << 20,
                alloc: Optional[Callable[[int], torch.Tensor]] = None,
                where: Callable[[Shape], str] = lambda s: f" on ragged instance {s.m}x{s.n}x{s.k}") -> CoverResult:
    """One random-input check on each of ``items`` (see the module docstring); raises
    :class:`CheckFailed` naming the first instance (in ``items``' order) that fails, ``where``
    appended to the message. ``alloc(nbytes)``: the block (default ``torch.empty``);
    ``sync``: the loader's synchronise (a launch error surfaces there)."""
    if not items:
        return CoverResult((), 0.0)
    need = _bytes_needed(items, guard_bytes)
    block = torch.empty(need, dtype=torch.uint8, device=device) if alloc is None else alloc(need)
    layout, used = _layout(items, block.data_ptr(), guard_bytes, rng, rng.random() < 0.5)
    if used > block.numel():
        raise RuntimeError(f"class-cover layout took {used} bytes of a {block.numel()}-byte block")
    count = len(items)
    ks = torch.tensor([float(it.shape.k) for it in items], device=device).view(count, 1, 1)  # before any launch
    block.random_(0, 256, generator=gen)  # every byte that is not data is a canary
    ops: list[CoverOperands] = []
    poisons = [POISONS[rng.randrange(len(POISONS))] for _ in items]  # C's poison, drawn per instance
    for it, wins in zip(items, layout):
        a, b, c, w = (_Window(block, *win) for win in wins)
        ops.append(CoverOperands(it.shape, a, b, c, w, it.workspace_bytes, zero_workspace))
    inputs = draw_random(1, sum(o.A.data.numel() + o.B.data.numel() for o in ops), gen, device).view(-1)
    at = 0
    for o, kind in zip(ops, poisons):
        for win in (o.A, o.B):
            n = win.data.numel()
            win.data.view(-1).copy_(inputs[at:at + n])
            at += n
        poison_(o.C.data, kind, gen, o.shape.k)
        o.W.data.fill_(0 if zero_workspace and o.workspace_bytes else workspace_fill(rng))
    del inputs
    pattern = block.clone()
    order = list(range(count))
    rng.shuffle(order)
    for i in order:
        items[i].call(ops[i])
    sync()  # launch errors surface here, as the loader's own error

    changed = block != pattern
    for o in ops:
        changed[o.C.lo:o.C.hi] = False
        changed[o.W.lo:o.W.hi] = False
    outside = changed.any()
    mx = max(o.shape.m for o in ops)
    nx = max(o.shape.n for o in ops)
    kx = max(o.shape.k for o in ops)
    a_pad = torch.zeros(count, mx, kx, dtype=torch.float16, device=device)
    b_pad = torch.zeros(count, kx, nx, dtype=torch.float16, device=device)
    c_pad = torch.zeros(count, mx, nx, dtype=torch.float16, device=device)
    for i, o in enumerate(ops):
        s = o.shape
        a_pad[i, :s.m, :s.k].copy_(o.A.data)
        b_pad[i, :s.k, :s.n].copy_(o.b_kn())
        c_pad[i, :s.m, :s.n].copy_(o.C.data)
    ref, rss, sabs = reference_scales(a_pad, b_pad)
    tol = tolerance_strict(ref, rss, sabs, ks.to(ref.dtype))
    err = (c_pad.to(ref.dtype) - ref).abs()
    bad = ~(err <= tol)
    worst = torch.nan_to_num(err, nan=float("inf")).flatten(1).amax(1)
    got = torch.cat([outside.double().reshape(1), bad.flatten(1).any(1).double(), worst.double()]).tolist()
    if got[0]:
        _raise_outside(changed, ops, where)
    for i, o in enumerate(ops):
        if got[1 + i]:  # the message every value check gives, on this instance's part of the batch
            m, n = o.shape.m, o.shape.n
            kept = pattern[o.C.lo:o.C.hi].view(torch.int16).view(m, n) if poisons[i] == "finite" else None
            raise value_failure(COVER_CHECK, o.C.data, ref[i, :m, :n], tol[i, :m, :n], bad[i, :m, :n], kept,
                                float(got[1 + count + i]), where(o.shape))
    return CoverResult((COVER_CHECK,) * count, max(got[1 + count:]))


def _raise_outside(changed: torch.Tensor, ops: Sequence[CoverOperands], where: Callable[[Shape], str]) -> None:
    """The slow path of a stray store: which input changed, or next to which window a canary did."""
    first = int(changed.nonzero()[0])
    windows = [(w, name, o) for o in ops for w, name in ((o.A, "A"), (o.B, "B"), (o.C, "C"), (o.W, "the workspace"))]
    for w, name, o in windows:
        if w.lo <= first < w.hi:
            raise CheckFailed(COVER_CHECK, f"modified input A or B{where(o.shape)}")
    w, name, o = min(windows, key=lambda x: min(abs(first - x[0].lo), abs(first - x[0].hi)))
    raise CheckFailed(COVER_CHECK, f"wrote outside {name} (guard band changed){where(o.shape)}")
