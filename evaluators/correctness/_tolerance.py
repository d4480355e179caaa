"""What a correctness check measures against: the fp16 output tolerances (derived in
:mod:`._correctness`'s docstring), the precision limit of the reference, and the failure a check
raises."""
from __future__ import annotations

import math
from typing import Optional, Union

import torch


EPS16 = 2.0 ** -10


EPS32 = 2.0 ** -23


C_RANDOM = 2.0


C_EXACT = 8.0


#: Reference in float64 up to this many multiply-adds, float32 (TF32 off) above.
FP64_LIMIT = 1 << 33


def ulp16(x: torch.Tensor) -> torch.Tensor:
    """fp16 spacing at |x| (2**-24 in the subnormal range), as float32: ``2**(floor(log2|x|) - 10)``,
    the float32 exponent bits of ``|x|`` kept and the mantissa cleared, times 2**-10 (four
    elementwise passes, where frexp and ldexp took six: the rechecks after timing judge every
    element of every set)."""
    a = x.abs().float().clamp_(min=2.0 ** -14, max=3.0e38)  # finite: |C - inf| never passes
    return a.view(torch.int32).bitwise_and_(0x7F800000).view(torch.float32).mul_(2.0 ** -10)


def tolerance_random(ref: torch.Tensor, rss: torch.Tensor) -> torch.Tensor:
    """``ulp16(R) + 2 * eps16 * T`` (see the module docstring)."""
    return ulp16(ref) + C_RANDOM * EPS16 * rss.float()


def _exact_scale(sabs: torch.Tensor, k: Union[int, torch.Tensor]) -> torch.Tensor:
    """``8 * sqrt(K) * eps32 * S``: the exact tolerance without its output rounding."""
    root = k.float().sqrt() if isinstance(k, torch.Tensor) else math.sqrt(k)
    return C_EXACT * root * EPS32 * sabs.float()


def tolerance_exact(ref: torch.Tensor, sabs: torch.Tensor, k: Union[int, torch.Tensor]) -> torch.Tensor:
    """``ulp16(R) + 8 * sqrt(K) * eps32 * S`` (see the module docstring); ``k`` a tensor that
    broadcasts against ``ref`` where a batch mixes K (the class cover's instances)."""
    return ulp16(ref) + _exact_scale(sabs, k)


def tolerance_strict(ref: torch.Tensor, rss: torch.Tensor, sabs: torch.Tensor, k: Union[int, torch.Tensor],
                     exact_rows: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The smaller of :func:`tolerance_random` and :func:`tolerance_exact`: what any output of an
    fp32 accumulation meets, random inputs or not (its rounding walk is far below both), so
    the final judgement of random-looking outputs applies the exact criterion too; below K of
    a few thousand that is the tighter one and a reduced-precision path fails it.
    ``exact_rows`` (a mask broadcasting against ``ref``): where it is set, the exact tolerance
    alone (the rows carrying the hidden cancellation, whose partial sums reach half of S, where
    the random-input bound does not hold for an honest fp32 sum). One ulp16 pass either way:
    min(u + a, u + b) = u + min(a, b) exactly, rounding being monotone."""
    exact = _exact_scale(sabs, k)
    loose = torch.minimum(C_RANDOM * EPS16 * rss.float(), exact)
    if exact_rows is not None:
        loose = torch.where(exact_rows, exact, loose)
    return loose.add_(ulp16(ref))


class CheckFailed(Exception):
    """A check the candidate did not pass; the message names the check."""

    def __init__(self, check: str, message: str, max_error: Optional[float] = None) -> None:
        super().__init__(f"{check}: {message}")
        self.check, self.max_error = check, max_error
