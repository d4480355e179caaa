"""The correctness cascade: does the candidate compute ``C = A·B`` (fp16 in/out, fp32 accumulation)?

Every check draws fresh inputs, poisons C with NaN, calls the candidate, synchronises, then
checks the guard bands around A, B, C and the workspace ("wrote outside ..."), that A and B are
unchanged ("modified input"), that no poison is left in C, and the values against a reference
computed in float64 (float32 with TF32 off for big shapes) from the same fp16 inputs.

Tolerances (elementwise; ``ulp16(x)`` is the fp16 spacing at ``|x|``, eps16 = 2**-10,
eps32 = 2**-23, ``R`` the reference):

- random inputs: ``|C - R| <= ulp16(R) + 2 * eps16 * T`` with ``T_ij = sqrt(sum_k (a_ik b_kj)^2)``,
  i.e. ``c * sqrt(K) * eps16 * rms_k|a_ik b_kj|``: one fp16 rounding of the output plus two fp16
  units of the typical output magnitude. fp32 accumulation lands far inside; fp16 accumulation
  (error ~ eps16 * T * sqrt(K/2)) fails from K of a few dozen on.
- exact probes (inputs whose fp32 sums are exact or nearly): ``|C - R| <= ulp16(R) + 8 * sqrt(K)
  * eps32 * S`` with ``S_ij = sum_k |a_ik b_kj|``: output rounding plus a generous fp32 rounding
  walk, and nothing more. These catch what random data cannot: cancellation (large values that
  cancel around small ones, valid at any K >= 3), large partial sums (above 65504 while the
  result is in range), all-ones at K >= 4096 (fp16 stalls at 2048) and low-entropy inputs.

Then a NaN planted at a random A[i, k1] must turn exactly row i of C into NaN and one at
B[k2, j] exactly column j: every k of that row and column was read.
"""
from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch

from populations import Shape

__all__ = ["EPS16", "EPS32", "ulp16", "tolerance_random", "tolerance_exact", "Guarded", "Operands",
           "CheckFailed", "Cascade", "ragged_instances", "large_ragged", "reference", "integer_reference", "recheck_sets", "RotationReference", "verify_sets",
           "WORKSPACE_FILLS", "workspace_fill"]

EPS16 = 2.0 ** -10
EPS32 = 2.0 ** -23
C_RANDOM = 2.0
C_EXACT = 8.0
#: Reference in float64 up to this many multiply-adds, float32 (TF32 off) above.
FP64_LIMIT = 1 << 33


def ulp16(x: torch.Tensor) -> torch.Tensor:
    """fp16 spacing at |x| (2**-24 in the subnormal range), as float32."""
    a = x.abs().float().clamp(min=2.0 ** -14)
    _, e = torch.frexp(a)
    return torch.ldexp(torch.ones_like(a), e - 11)


def tolerance_random(ref: torch.Tensor, rss: torch.Tensor) -> torch.Tensor:
    """``ulp16(R) + 2 * eps16 * T`` (see the module docstring)."""
    return ulp16(ref) + C_RANDOM * EPS16 * rss.float()


def tolerance_exact(ref: torch.Tensor, sabs: torch.Tensor, k: int) -> torch.Tensor:
    """``ulp16(R) + 8 * sqrt(K) * eps32 * S`` (see the module docstring)."""
    return ulp16(ref) + C_EXACT * math.sqrt(k) * EPS32 * sabs.float()


#: Bytes a non-zeroed workspace is filled with before a checked call and before every timed
#: replay, drawn at random each time: every one reads as NaN in fp16 and as NaN or a huge value
#: (|x| > 1e37) in fp32, so a kernel that reads a workspace before writing it fails; and since
#: checked and timed calls draw from the same set, the workspace's contents cannot tell them
#: apart, nor carry anything from one timed call to the next.
WORKSPACE_FILLS = (0xFF, 0xFE, 0xFD, 0x7F)


def workspace_fill(rng: Optional[random.Random]) -> int:
    """One of :data:`WORKSPACE_FILLS` (0xFF without an ``rng``)."""
    return WORKSPACE_FILLS[rng.randrange(len(WORKSPACE_FILLS))] if rng is not None else 0xFF


class CheckFailed(Exception):
    """A check the candidate did not pass; the message names the check."""

    def __init__(self, check: str, message: str, max_error: Optional[float] = None) -> None:
        super().__init__(f"{check}: {message}")
        self.check, self.max_error = check, max_error


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
        Always allocated in the order A, B, C, workspace (the same addresses job after job when
        ``alloc`` reuses blocks). ``movable``: room to move every data window between checks
        (:meth:`place`)."""
        b_rows, b_cols = (shape.n, shape.k) if shape.layout == "TN" else (shape.k, shape.n)
        g, mv = guard_bytes, movable
        return cls(shape, Guarded(shape.m, shape.k, device, gen, guard_bytes=g, alloc=alloc, movable=mv),
                   Guarded(b_rows, b_cols, device, gen, guard_bytes=g, alloc=alloc, movable=mv),
                   Guarded(shape.m, shape.n, device, gen, guard_bytes=g, alloc=alloc, movable=mv),
                   Guarded(1, workspace_bytes, device, gen, torch.uint8, guard_bytes=g, alloc=alloc, movable=mv),
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


def _mm_f32(a16: torch.Tensor, b16: torch.Tensor) -> torch.Tensor:
    """``a16 @ b16`` (batched or not) of fp16 operands with fp32 accumulation and output: on CUDA
    on tensor cores (``out_dtype``), elsewhere (or where this torch lacks it) by upcasting.

    For tolerance scales only (``T``, ``S``), never for a reference value: a scale off by the
    fp32 accumulation error (well under 0.1%) moves a tolerance by as much. On a GPU whose torch
    lacks ``out_dtype``, bf16 tensor cores (fp16's range would overflow a large-value probe's
    ``S``; bf16 rounding moves a scale by under 1%), not a float32 GEMM on CUDA cores."""
    mm = torch.bmm if a16.dim() == 3 else torch.mm
    if a16.is_cuda and a16.dtype is torch.float16:
        if _TC_OUT_DTYPE[0]:
            try:
                return mm(a16, b16, out_dtype=torch.float32)
            except (TypeError, RuntimeError, NotImplementedError):
                _TC_OUT_DTYPE[0] = False  # this torch cannot: bf16 from now on
        return mm(a16.bfloat16(), b16.bfloat16()).float()
    return mm(a16.float(), b16.float())


#: Whether ``torch.mm(..., out_dtype=torch.float32)`` works here (cleared at its first failure).
_TC_OUT_DTYPE = [True]


def _rss_fp16(a: torch.Tensor, b_kn: torch.Tensor) -> torch.Tensor:
    """``T = sqrt(sum_k a^2 b^2)`` (batched or not) from fp16 squares on tensor cores, as float32.

    Only a tolerance's scale (its 0.1% rounding is immaterial, a square that underflows only
    tightens it), and at the big shapes where the references run in float32 this product was
    half their cost: the after-timing checks verify every rotation set. fp32 accumulation and
    output (:func:`_mm_f32`): a sum of squares cannot overflow fp16's range there."""
    return _mm_f32(a.half().square(), b_kn.half().square()).sqrt()


def _abs_fp16(a: torch.Tensor, b_kn: torch.Tensor) -> torch.Tensor:
    """``S = sum_k |a b|`` of fp16 operands (exact in fp16: ``|x|``) on tensor cores, as float32:
    the exact probes' tolerance scale, like ``T`` a scale and not a value (see :func:`_mm_f32`)."""
    return _mm_f32(a.half().abs(), b_kn.half().abs())


def reference(a: torch.Tensor, b_kn: torch.Tensor, *, exact_terms: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(R, scale): R = a @ b in fp64/fp32; scale = T (rss of products) or S (sum of |products|).

    R is always the precise product (float64, float32 with TF32 off above :data:`FP64_LIMIT`
    multiply-adds on a GPU); the scales come from fp16 tensor cores on a GPU (:func:`_mm_f32`),
    one GEMM at tensor-core speed instead of a second one in float32 on CUDA cores."""
    m, k = a.shape
    n = b_kn.shape[1]
    dt = torch.float64 if m * n * k <= FP64_LIMIT or a.device.type == "cpu" else torch.float32
    a2, b2 = a.to(dt), b_kn.to(dt)
    ref = a2 @ b2
    if a.is_cuda and a.dtype is torch.float16:
        scale = _abs_fp16(a, b_kn) if exact_terms else _rss_fp16(a, b_kn)
    elif exact_terms:
        scale = a2.abs() @ b2.abs()
    else:
        scale = (a2 * a2 @ (b2 * b2)).sqrt()
    return ref, scale


def integer_reference(a: torch.Tensor, b_kn: torch.Tensor) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """(R, S) of integer-valued fp16 operands with ``|x| <= 127`` exactly, from an int8 GEMM with
    int32 accumulation on a GPU: every partial sum is an integer below ``K * 127**2 < 2**31``,
    so R is what float64 gives (and what float32 gives while ``K * max|a b| < 2**24``, as in
    :meth:`Cascade.special`). The caller guarantees the values; None where this does not apply
    (CPU, a shape the int8 GEMM refuses) and the caller computes R in floating point."""
    m, k = a.shape
    n = b_kn.shape[1]
    if not a.is_cuda or m <= 16 or k % 8 or n % 8 or k * 127 * 127 >= 1 << 31:
        return None
    try:
        ai, bi = a.to(torch.int8), b_kn.to(torch.int8).contiguous()
        ref = torch._int_mm(ai, bi)
        sabs = torch._int_mm(ai.abs(), bi.abs())
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    dt = torch.float64 if m * n * k <= FP64_LIMIT else torch.float32
    return ref.to(dt), sabs.to(dt)


Call = Callable[[Operands], None]


@dataclass
class Cascade:
    """Runs the checks of one shape on one set of guarded operands."""

    ops: Operands
    call: Call
    sync: Callable[[], None]
    gen: torch.Generator
    max_error: float = 0.0
    checks: list[str] = field(default_factory=list)
    #: Move the operands before every check, 2 MiB-aligned and random placements alternating
    #: (operands allocated ``movable``); ``gapped``: VA-reserved blocks (nothing mapped below).
    placements: Optional[random.Random] = None
    gapped: bool = False
    _fills: int = 0

    # -- one call with every invariant checked ------------------------------------------
    def _run(self, check: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Call the candidate once on fresh poison; (C, pending): ``pending`` holds, on the
        device, whether each canary band (A, B, C, workspace) and each input (A, B) changed.
        :meth:`_compare` reads it with the values in one synchronisation, and raises for it
        first (a write outside the buffers beats a wrong value)."""
        ops = self.ops
        saved_a, saved_b = ops.A.data.view(torch.int16).clone(), ops.B.data.view(torch.int16).clone()
        ops.C.data.fill_(float("nan"))
        if ops.workspace_bytes:  # NaN (or huge) in fp16 and fp32, the byte drawn as for timed calls
            ops.W.data.fill_(0 if ops.zero_workspace else workspace_fill(self.placements))
        self.call(ops)  # stream-ordered after the fills
        self.sync()  # launch errors surface here, as the loader's own error
        pending = torch.stack([g.guards_changed() for g in (ops.A, ops.B, ops.C, ops.W)]
                              + [(ops.A.data.view(torch.int16) != saved_a).any(),
                                 (ops.B.data.view(torch.int16) != saved_b).any()])
        return ops.C.data, pending

    def _compare(self, check: str, c: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor, record: bool = True,
                 pending: Optional[torch.Tensor] = None, before: tuple = ()) -> None:
        """Raise unless every element is within ``tol``; ``max_error`` tracks the random-input checks.

        ``pending`` (from :meth:`_run`) and ``before`` (pairs of a 0-d bool tensor, true on
        failure, and its message, checked after the guards and before the values) are read in
        the same single synchronisation as the error statistics."""
        err = (c.to(ref.dtype) - ref).abs()
        bad = ~(err <= tol)
        worst = torch.nan_to_num(err, nan=float("inf")).amax() if err.numel() else err.new_zeros(())
        head = [] if pending is None else [pending.double()]
        flags = [f.double().reshape(1) for f, _ in before]
        got = torch.cat(head + flags + [worst.double().reshape(1), bad.any().double().reshape(1)]).tolist()
        if pending is not None:
            self._verdict(check, got[:6])
            got = got[6:]
        for value, (_, message) in zip(got, before):
            if value:
                raise CheckFailed(check, message)
        worst_f, any_bad = float(got[-2]), bool(got[-1])
        if record:
            self.max_error = max(self.max_error, worst_f)
        if any_bad:
            idx = int(bad.flatten().nonzero()[0])
            i, j = divmod(idx, c.shape[1])
            nans = int(torch.isnan(c).sum())
            why = f"{nans} elements of C left NaN (not written, or NaN produced); " if nans else ""
            raise CheckFailed(check, f"{why}{int(bad.sum())} of {c.numel()} elements outside tolerance; first at "
                                     f"C[{i},{j}] = {float(c[i, j])!r} vs reference {float(ref[i, j]):.6g} "
                                     f"(tolerance {float(tol[i, j]):.3g}); max error {worst_f:.4g}", worst_f)

    def _verdict(self, check: str, changed: list) -> None:
        """Raise for a changed canary band or input (the values of :meth:`_run`'s ``pending``)."""
        for name, bad in zip(("A", "B", "C", "the workspace"), changed):
            if bad:
                raise CheckFailed(check, f"wrote outside {name} (guard band changed)")
        if changed[4] or changed[5]:
            raise CheckFailed(check, "modified input A or B")
        self.checks.append(check)

    def _fill(self, a: torch.Tensor, b: torch.Tensor) -> None:
        if self.placements is not None:  # every check calls _fill before _run
            self.ops.place(self._fills % 2 == 0, self.placements, self.gapped)
            self._fills += 1
        self.ops.A.data.copy_(a)
        self.ops.B.data.copy_(b if self.ops.shape.layout == "NN" else b.t())

    def _uniform(self, rows: int, cols: int, lo: float = -1.0, hi: float = 1.0) -> torch.Tensor:
        return torch.empty(rows, cols, dtype=torch.float16, device=self.ops.A.data.device).uniform_(lo, hi, generator=self.gen)

    # -- the checks -------------------------------------------------------------------
    def random(self, check: str = "random inputs", lo: float = -1.0, hi: float = 1.0) -> None:
        s = self.ops.shape
        self._fill(self._uniform(s.m, s.k, lo, hi), self._uniform(s.k, s.n, lo, hi))
        c, pending = self._run(check)
        ref, rss = reference(self.ops.A.data, self.ops.b_kn(), exact_terms=False)
        self._compare(check, c, ref, tolerance_random(ref, rss), pending=pending)

    def exact(self, check: str, a: torch.Tensor, b_kn: torch.Tensor,
              known: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> None:
        """An exact probe on ``a``, ``b_kn``; ``known``: its (R, S), when the caller has them
        without a floating-point GEMM (an integer GEMM, or a closed form); else computed from
        the operands after the call (which were checked unchanged)."""
        self._fill(a, b_kn)
        c, pending = self._run(check)
        ref, sabs = known if known is not None else reference(self.ops.A.data, self.ops.b_kn(), exact_terms=True)
        self._compare(check, c, ref, tolerance_exact(ref, sabs, self.ops.shape.k), record=False, pending=pending)

    def cancellation(self) -> None:
        """+L·b at k=0 and -L·b at k=K-1 around small terms: an fp16 accumulator drops the small ones."""
        s = self.ops.shape
        if s.k < 3:
            return
        a, b = self._uniform(s.m, s.k), self._uniform(s.k, s.n)
        a[:, 0], a[:, -1] = 1024.0, -1024.0
        b[-1, :] = b[0, :]
        self.exact("cancellation probe", a, b)

    def outlier_cancellation(self) -> None:
        """Random-looking data with a few rows carrying large non-integer outliers of random sign at
        k1 < K/2 <= k2 that cancel (B's rows k1 and k2 equal): fp32 sums are near exact, but a
        split-K partial stored in fp16 rounds one of the pair. Nothing integral or fixed to
        fingerprint (unlike the other exact probes)."""
        s = self.ops.shape
        if s.k < 2:
            return
        dev = self.ops.A.data.device
        a, b = self._uniform(s.m, s.k), self._uniform(s.k, s.n)
        pick = torch.randint(0, 2**31 - 1, (2,), generator=self.gen, device=dev).tolist()
        k1, k2 = pick[0] % (s.k // 2) if s.k >= 2 else 0, s.k // 2 + pick[1] % (s.k - s.k // 2)
        rows = torch.randperm(s.m, generator=self.gen, device=dev)[: max(1, s.m // 8)]
        mag = torch.empty(len(rows), device=dev).uniform_(1000.0, 4000.0, generator=self.gen)
        sign = torch.randint(0, 2, (len(rows),), generator=self.gen, device=dev) * 2 - 1
        v = (mag * sign).half()
        a[rows, k1], a[rows, k2] = v, -v
        b[k2, :] = b[k1, :]
        self.exact("outlier cancellation probe", a, b)

    def large_values(self) -> None:
        """Partial sums pass 65504 (fp16 overflow) while the result stays in range."""
        s = self.ops.shape
        if s.k < 8:
            return
        amp = 2.0 ** math.ceil(math.log2(math.sqrt(min(16384.0, 4 * 65504.0 / s.k))))
        a = self._uniform(s.m, s.k) + amp
        a[:, s.k // 2:] -= 2 * amp  # first half of k positive, second half negative: the sum cancels
        b = self._uniform(s.k, s.n) + amp
        self.exact("large-value probe (partial sums above 65504)", a, b)

    def special(self) -> None:
        """Low-entropy small integers with zero bands and ones: a 'fast path' must still be right."""
        s = self.ops.shape
        dev = self.ops.A.data.device
        a = torch.randint(-3, 4, (s.m, s.k), generator=self.gen, device=dev).half()
        b = torch.randint(-3, 4, (s.k, s.n), generator=self.gen, device=dev).half()
        a[: max(1, s.m // 4)] = 0               # zero rows: C rows must be written as exact zeros
        a[:, s.k // 2: s.k // 2 + max(1, s.k // 8)] = 0
        b[:, : max(1, s.n // 4)] = 1.0           # a band of ones
        self.exact("special values (zeros, ones, small integers)", a, b, integer_reference(a, b))

    def all_ones(self) -> None:
        """A = B = 1: C = K exactly; fp16 accumulation stalls at 2048."""
        s = self.ops.shape
        dev = self.ops.A.data.device
        dt = torch.float64 if s.m * s.n * s.k <= FP64_LIMIT or dev.type == "cpu" else torch.float32
        k = torch.full((s.m, s.n), float(s.k), dtype=dt, device=dev)  # R = S = K exactly, no GEMM needed
        self.exact(f"all-ones probe (K={s.k})", torch.ones(s.m, s.k, dtype=torch.float16, device=dev),
                   torch.ones(s.k, s.n, dtype=torch.float16, device=dev), (k, k))

    def planted_nan(self) -> None:
        """NaN at A[i,k1] must reach exactly row i of C, NaN at B[k2,j] exactly column j."""
        s = self.ops.shape
        check = "planted NaN"
        a, b = self._uniform(s.m, s.k), self._uniform(s.k, s.n)
        pick = torch.randint(0, 2**31 - 1, (4,), generator=self.gen, device=a.device).tolist()
        i, k1, k2, j = pick[0] % s.m, pick[1] % s.k, pick[2] % s.k, pick[3] % s.n
        a[i, k1] = float("nan")
        b[k2, j] = float("nan")
        self._fill(a, b)
        c, pending = self._run(check)
        want = torch.zeros(s.m, s.n, dtype=torch.bool, device=c.device)
        want[i, :] = True
        want[:, j] = True
        got = torch.isnan(c)
        a0, b0 = a.clone(), b.clone()
        a0[i, k1] = 0
        b0[k2, j] = 0
        ref, rss = reference(a0, b0, exact_terms=False)
        keep = ~want
        before = ((~got[i, :].all(), f"NaN planted at A[{i},{k1}] did not reach all of row {i} of C "
                                     f"(element k={k1} was not read for some columns)"),
                  (~got[:, j].all(), f"NaN planted at B(k={k2}, n={j}) did not reach all of column {j} of C"),
                  ((got & ~want).any(), f"NaN spread beyond row {i} and column {j} of C (or C was left unwritten)"))
        self._compare(check, torch.where(keep, c, torch.zeros_like(c)),
                      torch.where(keep, ref, torch.zeros_like(ref)), tolerance_random(ref, rss),
                      pending=pending, before=before)

    def full(self, generic: bool) -> None:
        """Every check, cheapest first; raises :class:`CheckFailed` at the first failure."""
        self.random()
        self.random("same buffers re-filled with other data", -2.0, 2.0)
        self.planted_nan()
        self.cancellation()
        self.outlier_cancellation()
        self.large_values()
        self.special()
        if self.ops.shape.k >= 2048:
            self.all_ones()

    def smoke(self) -> None:
        """The small-instance checks for generic candidates."""
        self.random()
        self.planted_nan()


def ragged_instances(shape: Shape, tma_pitch: set[str], rng: Optional[random.Random] = None) -> list[Shape]:
    """Small ragged problems of ``shape``'s layout for generic candidates (1x1x1, 7x13x17, 129x257x65,
    100x111x77: residues mod 64 from 1 to 47), with ``rng`` one more with residues drawn at random
    (17..63 past a multiple of 64), plus a K >= 4096 instance for the all-ones probe. Dimensions
    used as a tensor-map row pitch (``tma_pitch``: 'K' and/or 'N') are rounded up to a multiple
    of 8, which TMA requires."""
    def fix(m: int, n: int, k: int) -> Shape:
        if "K" in tma_pitch:
            k = -(-k // 8) * 8
        if "N" in tma_pitch:
            n = -(-n // 8) * 8
        return shape.with_dims(m, n, k)
    out = [fix(1, 1, 1), fix(7, 13, 17), fix(129, 257, 65), fix(100, 111, 77)]
    if rng is not None:
        out.append(fix(*(64 * rng.randint(1, 3) + rng.randint(17, 63) for _ in range(3))))
    return out + [fix(65, 72, 4104)]


def large_ragged(shape: Shape, tma_pitch: set[str], rng: random.Random) -> Shape:
    """The claimed shape with ragged M, N and K tails: each dimension above 1 cut by 1..63 (at
    random), so the grid is as large as the claimed one (a kernel cannot tell a check by its
    size) and every edge tile and the K tail are partial. TMA pitch dimensions stay multiples of 8."""
    def cut(d: int, pitch: bool) -> int:
        if d <= 1:
            return d
        out = d - max(1, min(d - 1, rng.randint(1, 63)))
        return max(8, out // 8 * 8) if pitch and d > 8 else out
    return shape.with_dims(cut(shape.m, False), cut(shape.n, "N" in tma_pitch), cut(shape.k, "K" in tma_pitch))


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
        t3[index] = torch.empty(old.shape, dtype=t3.dtype, device=t3.device).uniform_(-1, 1, generator=gen)

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
                row_ids: Optional[list[int]] = None, base: Optional[RotationReference] = None) -> None:
    """Every set of a rotation: ``C[i] == A[i]·B[i]`` within the random-input tolerance, else
    :class:`CheckFailed` naming the set and ``where`` (``b3`` as stored for ``layout``).
    ``set_ids``/``row_ids``: the sets' and rows' numbers in the rotation when ``a3``/``c3`` hold
    only some of them (for the message). ``base``: the whole rotation's pristine reference
    (:class:`RotationReference`; ``a3``/``b3`` are then every set of it): the reference is that
    one with what changed recomputed (:func:`_reference_from_base`), not a full product."""
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
            rss = _rss_fp16(a3[lo:lo + chunk], b_kn)
        else:
            a, bk = a3[lo:lo + chunk].to(dt), b_kn.to(dt)
            rss = torch.bmm(a * a, bk * bk).sqrt()
        c = c3[lo:lo + chunk]
        bad = ~((c.to(dt) - ref).abs() <= tolerance_random(ref, rss))
        if bool(bad.any()):
            idx = bad.flatten().nonzero()[0].item()
            s, rem = divmod(idx, m * n)
            i, j = divmod(rem, n)
            set_no = set_ids[lo + s] if set_ids else lo + s
            row_no = row_ids[i] if row_ids else i
            raise CheckFailed(check, f"{where}: rotation set {set_no} {what} "
                                     f"({int(bad.sum())} bad elements; C[{row_no},{j}] = {float(c[s, i, j])!r} vs "
                                     f"{float(ref[s, i, j]):.6g}): state kept across calls, or stale/trusted outputs")


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
