"""The reference a candidate's output is compared with: the product in float64 (float32 above
:data:`FP64_LIMIT`), with its tolerance scale from fp16 tensor cores on a GPU, and an exact int8
path for integer-valued probes."""
from __future__ import annotations

from typing import Optional

import torch

from ._tolerance import FP64_LIMIT


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


def reference_scales(a: torch.Tensor, b_kn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(R, T, S) of :func:`reference`: the value and both tolerance scales (for
    :func:`._tolerance.tolerance_strict`), batched or not."""
    dt = torch.float64 if a.shape[-2] * b_kn.shape[-1] * a.shape[-1] <= FP64_LIMIT or a.device.type == "cpu" \
        else torch.float32
    a2, b2 = a.to(dt), b_kn.to(dt)
    ref = a2 @ b2
    if a.is_cuda and a.dtype is torch.float16:
        return ref, _rss_fp16(a, b_kn), _abs_fp16(a, b_kn)
    return ref, (a2 * a2 @ (b2 * b2)).sqrt(), a2.abs() @ b2.abs()


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
