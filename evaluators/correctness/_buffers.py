"""The buffers a checked call runs on: canary-guarded blocks placed at varying alignments
(:class:`Guarded`), the operands of one check (:class:`Operands`), and the bytes a workspace is
filled with before every checked or timed call."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from populations import Shape


#: Bytes a non-zeroed workspace is filled with before a checked call and before every timed
#: replay, drawn at random each time: every one reads as NaN in fp16 and as NaN or a huge value
#: (|x| > 1e37) in fp32, so a kernel that reads a workspace before writing it fails; and since
#: checked and timed calls draw from the same set, the workspace's contents cannot tell them
#: apart, nor carry anything from one timed call to the next.
WORKSPACE_FILLS = (0xFF, 0xFE, 0xFD, 0x7F)


def workspace_fill(rng: Optional[random.Random]) -> int:
    """One of :data:`WORKSPACE_FILLS` (0xFF without an ``rng``)."""
    return WORKSPACE_FILLS[rng.randrange(len(WORKSPACE_FILLS))] if rng is not None else 0xFF


#: Alignment that a cheat keyed on buffer placement may look for (torch's large allocations are
#: 2 MiB aligned, VA-reserved blocks too); checked placements include it and everything else.
PLACEMENT_ALIGN = 2 << 20


#: Extra room in a block for moving the data window: one alignment step plus this much jitter.
PLACEMENT_JITTER = 4 << 20


class Guarded:
    """A matrix (or workspace) with canary bands of random bits before and after it.

    ``alloc(nbytes)`` (default ``torch.empty``) may return more bytes than asked for (a whole
    VA-reserved block, :mod:`evaluators.run._vmm`): the upper canary then runs to the block's end, so
    every mapped byte around the data is checked and the unmapped gaps beyond fault.

    With ``movable`` the block has room to move the data window (:meth:`place`): at an address
    that is a multiple of 2 MiB, or at a random 256-byte step further on, so that a kernel that
    behaves differently by where its buffers sit (alignment, address bits) meets both kinds of
    placement in the checked calls. Every move re-draws the canaries."""

    def __init__(self, rows: int, cols: int, device: torch.device, gen: torch.Generator, dtype=torch.float16,
                 guard_bytes: Optional[int] = None, alloc: Optional[Callable[[int], torch.Tensor]] = None,
                 movable: bool = False) -> None:
        n = rows * cols
        esize = torch.empty((), dtype=dtype).element_size()
        if guard_bytes is None:  # 256 rows past the edge, 32 KiB to 8 MiB
            band = max(32768 // esize, min(256 * max(cols, 1), (8 << 20) // esize))
        else:
            band = guard_bytes // esize
        band = -(-band // (256 // esize)) * (256 // esize)  # keep the data 256-byte aligned
        self.rows, self.cols, self.n, self.esize, self.gen = rows, cols, n, esize, gen
        self.min_band = band
        want = (2 * band + n) * esize + ((PLACEMENT_ALIGN + PLACEMENT_JITTER) if movable else 0)
        raw = torch.empty(want, dtype=torch.uint8, device=device) if alloc is None else alloc(want)
        self.full = raw[: raw.numel() // esize * esize].view(dtype)
        self._at(band)

    def _at(self, band: int) -> None:
        esize = self.esize
        if band < 0 or (band + self.n) * esize > self.full.numel() * esize:
            raise ValueError(f"data window at element {band} does not fit the block")
        self.band = band
        bits = self.full.view(torch.uint8)
        bits.random_(0, 256, generator=self.gen)
        self._lo, self._hi = band * esize, (band + self.n) * esize
        self.pattern_lo, self.pattern_hi = bits[:self._lo].clone(), bits[self._hi:].clone()
        self.data = self.full[band:band + self.n].view(self.rows, self.cols)

    def place(self, aligned: bool, rng: random.Random, gapped: bool) -> None:
        """Move the data window: to the first 2 MiB boundary at or after the lowest allowed start
        (``gapped``: the block's own start, below which the unmapped gap faults; else past the
        canary band), or to a random 256-byte step in the jitter room."""
        base = self.full.data_ptr()
        low = 0 if gapped else self.min_band * self.esize
        if aligned:
            start = -(-(base + low) // PLACEMENT_ALIGN) * PLACEMENT_ALIGN - base
        else:
            start = low + 256 * rng.randrange(PLACEMENT_JITTER // 256)
        room = self.full.numel() * self.esize - self.n * self.esize - self.min_band * self.esize
        self._at(min(start, max(0, room)) // self.esize)

    def guards_intact(self) -> bool:
        return not bool(self.guards_changed())

    def guards_changed(self) -> torch.Tensor:
        """:meth:`guards_intact` negated, as a 0-d bool tensor on the device (no host sync: a
        caller checks several buffers with one ``tolist()``)."""
        bits = self.full.view(torch.uint8)
        return torch.logical_or((bits[:self._lo] != self.pattern_lo).any(), (bits[self._hi:] != self.pattern_hi).any())

    @property
    def ptr(self) -> int:
        return self.full[self.band:].data_ptr()


#: Bytes of the workspace row a plan without a workspace still gets (its ``workspace`` pointer
#: points there): in checked calls as in every timing set, filled the same way before every
#: call, so its contents cannot tell a check from a timed call.
EMPTY_WORKSPACE_ROW = 256


@dataclass
class Operands:
    """Guarded A, B (as stored for the layout), C and workspace for one shape."""

    shape: Shape
    A: Guarded
    B: Guarded
    C: Guarded
    W: Guarded
    workspace_bytes: int
    zero_workspace: bool

    @classmethod
    def allocate(cls, shape: Shape, workspace_bytes: int, zero_workspace: bool, device: torch.device,
                 gen: torch.Generator, guard_bytes: Optional[int] = None,
                 alloc: Optional[Callable[[int], torch.Tensor]] = None, movable: bool = False) -> "Operands":
        """``guard_bytes`` per side of every operand (the GPU harness uses 64 MiB on plain
        allocations, so far stores land in a canary rather than in memory nobody checks, and 1 MiB
        in VA-reserved blocks, whose unmapped gaps fault); default 256 rows, 32 KiB to 8 MiB.
        A plan without a workspace gets an :data:`EMPTY_WORKSPACE_ROW`-byte row (``workspace_bytes``
        stays 0). Always allocated in the order A, B, C, workspace (the same addresses job after job when
        ``alloc`` reuses blocks). ``movable``: room to move every data window between checks
        (:meth:`place`)."""
        b_rows, b_cols = (shape.n, shape.k) if shape.layout == "TN" else (shape.k, shape.n)
        g, mv = guard_bytes, movable
        row = max(workspace_bytes, EMPTY_WORKSPACE_ROW)  # without a workspace: a row like a timing set's
        return cls(shape, Guarded(shape.m, shape.k, device, gen, guard_bytes=g, alloc=alloc, movable=mv),
                   Guarded(b_rows, b_cols, device, gen, guard_bytes=g, alloc=alloc, movable=mv),
                   Guarded(shape.m, shape.n, device, gen, guard_bytes=g, alloc=alloc, movable=mv),
                   Guarded(1, row, device, gen, torch.uint8, guard_bytes=g, alloc=alloc, movable=mv),
                   workspace_bytes, zero_workspace)

    def place(self, aligned: bool, rng: random.Random, gapped: bool) -> None:
        """Move A, B, C and the workspace: all to 2 MiB boundaries, or each to its own random
        offset (see :meth:`Guarded.place`)."""
        for g in (self.A, self.B, self.C, self.W):
            g.place(aligned, rng, gapped)

    def b_kn(self, b: Optional[torch.Tensor] = None) -> torch.Tensor:
        """B as the K×N operand of the product (a view)."""
        b = self.B.data if b is None else b
        return b.t() if self.shape.layout == "TN" else b

    def pointers(self) -> dict[str, int]:
        return {"A": self.A.ptr, "B": self.B.ptr, "C": self.C.ptr, "workspace": self.W.ptr}
