"""The correctness cascade: does the candidate compute ``C = A·B`` (fp16 in/out, fp32 accumulation)?

Every check draws fresh inputs, poisons C (NaN, or finite values of an output's size, drawn per
call: :func:`._probes.poison_`), calls the candidate, synchronises, then
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
  walk, and nothing more. These catch what random data cannot: cancellation (sign-coherent
  partial sums that cancel exactly, hidden in random-looking data), large partial sums (above
  65504 while the result is in range), all-ones at K >= 4096 (fp16 stalls at 2048) and
  low-entropy inputs.

Random inputs are drawn as the timed calls' inputs are (uniform, then scrambled:
:func:`._probes.draw_random`) and judged by both tolerances (the smaller of the two: an fp32
accumulation meets either, a reduced-precision one fails the exact one at small K), and the
cancellation probe hides in such data (:func:`._probes.embed_cancellation`: no value above 2,
positions drawn per call), run once on NaN and once on finite poison, so that neither the
inputs' magnitudes nor C's poison tell a check from a timed call.

Then a NaN planted at a random A[i, k1] must turn exactly row i of C into NaN and one at
B[k2, j] exactly column j: every k of that row and column was read.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from ._buffers import Operands, workspace_fill
from ._probes import POISONS, draw_random, embed_cancellation, poison_
from ._reference import integer_reference, reference, reference_scales
from ._tolerance import FP64_LIMIT, CheckFailed, tolerance_exact, tolerance_random, tolerance_strict

__all__ = ["Cascade", "value_failure"]


Call = Callable[[Operands], None]


def value_failure(check: str, c: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor, bad: torch.Tensor,
                  poison: Optional[torch.Tensor], worst: float, where: str = "") -> CheckFailed:
    """The failure of a value check, told as every check tells it: C's elements left NaN, left
    holding the finite ``poison`` (C's poison as int16, None where it was NaN), how many are
    outside ``tol`` and the first of them (``bad``: where; ``where``: appended to the message).
    Off the fast path: only a failing check builds it."""
    idx = int(bad.flatten().nonzero()[0])
    i, j = divmod(idx, c.shape[1])
    nans = int(torch.isnan(c).sum())
    why = f"{nans} elements of C left NaN (not written, or NaN produced); " if nans else ""
    if poison is not None and poison.shape == c.shape:
        left = int(((c.view(torch.int16) == poison) & bad).sum())
        why += f"{left} elements of C left holding the poison (finite, not written); " if left else ""
    return CheckFailed(check, f"{why}{int(bad.sum())} of {c.numel()} elements outside tolerance; first at "
                              f"C[{i},{j}] = {float(c[i, j])!r} vs reference {float(ref[i, j]):.6g} "
                              f"(tolerance {float(tol[i, j]):.3g}); max error {worst:.4g}{where}", worst)


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
    _poison: Optional[torch.Tensor] = None
    #: Draws each call's poison of C (:func:`._probes.poison_`); seeded from ``gen`` by default.
    poisons: Optional[random.Random] = None

    def __post_init__(self) -> None:
        if self.poisons is None:
            self.poisons = random.Random(self.gen.initial_seed())

    # -- one call with every invariant checked ------------------------------------------
    def _run(self, check: str, poison: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Call the candidate once on fresh poison (``poison``: "nan" or "finite", else drawn at
        random); (C, pending): ``pending`` holds, on the
        device, whether each canary band (A, B, C, workspace) and each input (A, B) changed.
        :meth:`_compare` reads it with the values in one synchronisation, and raises for it
        first (a write outside the buffers beats a wrong value)."""
        ops = self.ops
        saved_a, saved_b = ops.A.data.view(torch.int16).clone(), ops.B.data.view(torch.int16).clone()
        kind = poison or POISONS[self.poisons.randrange(len(POISONS))]
        poison_(ops.C.data, kind, self.gen, ops.shape.k)
        self._poison = ops.C.data.view(torch.int16).clone() if kind == "finite" else None  # for the message
        # NaN (or huge) in fp16 and fp32, the byte drawn as for timed calls; the row of a plan
        # without a workspace too (a timing set's row is refilled the same way)
        zeroed = ops.zero_workspace and ops.workspace_bytes
        ops.W.data.fill_(0 if zeroed else workspace_fill(self.placements or self.poisons))
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
            raise value_failure(check, c, ref, tol, bad, self._poison, worst_f)

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

    def _random(self, rows: int, cols: int) -> torch.Tensor:
        """Random data as every random-looking input is drawn (:func:`._probes.draw_random`)."""
        return draw_random(rows, cols, self.gen, self.ops.A.data.device)

    def _uniform(self, rows: int, cols: int, lo: float = -1.0, hi: float = 1.0) -> torch.Tensor:
        return torch.empty(rows, cols, dtype=torch.float16, device=self.ops.A.data.device).uniform_(lo, hi, generator=self.gen)

    # -- the checks -------------------------------------------------------------------
    def random(self, check: str = "random inputs", lo: float = -1.0, hi: float = 1.0) -> None:
        """Inputs drawn as the timed calls' are (:func:`._probes.draw_random`), judged by the
        smaller of the random-input and exact tolerances (:func:`tolerance_strict`)."""
        s = self.ops.shape
        dev = self.ops.A.data.device
        self._fill(draw_random(s.m, s.k, self.gen, dev, lo, hi), draw_random(s.k, s.n, self.gen, dev, lo, hi))
        c, pending = self._run(check)
        ref, rss, sabs = reference_scales(self.ops.A.data, self.ops.b_kn())
        self._compare(check, c, ref, tolerance_strict(ref, rss, sabs, s.k), pending=pending)

    def exact(self, check: str, a: torch.Tensor, b_kn: torch.Tensor,
              known: Optional[tuple[torch.Tensor, torch.Tensor]] = None, poison: Optional[str] = None) -> None:
        """An exact probe on ``a``, ``b_kn``; ``known``: its (R, S), when the caller has them
        without a floating-point GEMM (an integer GEMM, or a closed form); else computed from
        the operands after the call (which were checked unchanged)."""
        self._fill(a, b_kn)
        c, pending = self._run(check, poison)
        ref, sabs = known if known is not None else reference(self.ops.A.data, self.ops.b_kn(), exact_terms=True)
        self._compare(check, c, ref, tolerance_exact(ref, sabs, self.ops.shape.k), record=False, pending=pending)

    def cancellation(self, poison: Optional[str] = None) -> None:
        """Exact cancellation hidden in random-looking data (:func:`._probes.embed_cancellation`):
        a quarter of the rows of C are exactly 0 while their partial sums are sign-coherent and
        large; no value above 2. ``poison``: C's poison for this call (else drawn)."""
        s = self.ops.shape
        if s.k < 2:
            return
        a, b = self._random(s.m, s.k), self._random(s.k, s.n)
        embed_cancellation(a, b, self.gen)
        self.exact("cancellation probe", a, b, poison=poison)

    def outlier_cancellation(self) -> None:
        """Random-looking data with a few rows carrying large non-integer outliers of random sign at
        k1 < K/2 <= k2 that cancel (B's rows k1 and k2 equal): fp32 sums are near exact, but a
        split-K partial stored in fp16 rounds one of the pair. Nothing integral or fixed to
        fingerprint (unlike the other exact probes)."""
        s = self.ops.shape
        if s.k < 2:
            return
        dev = self.ops.A.data.device
        a, b = self._random(s.m, s.k), self._random(s.k, s.n)
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
        a, b = self._random(s.m, s.k), self._random(s.k, s.n)
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
        for poison in self.poisons.sample(POISONS, len(POISONS)):  # on each poison, in random order
            self.cancellation(poison)
        self.outlier_cancellation()
        self.large_values()
        self.special()
        if self.ops.shape.k >= 2048:
            self.all_ones()

    def smoke(self) -> None:
        """The small-instance checks for generic candidates."""
        self.random()
        self.planted_nan()
