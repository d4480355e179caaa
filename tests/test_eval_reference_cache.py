"""The cheaper references of the correctness cascade and the after-timing recheck (issue 18's
throughput target), on the CPU: a rotation's reference is computed once from its pristine
inputs and each recheck pass recomputes only what it changed; the exact probes get their
tolerance scale or their whole reference without a floating-point GEMM where one is not needed.
None of it may let through what the full computation caught."""
from __future__ import annotations

import os
import random
import sys

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from evaluators.correctness import _recheck, _reference  # noqa: E402
from evaluators.correctness import (Cascade, CheckFailed, Operands, RotationReference, recheck_sets,  # noqa: E402
                                     verify_sets)
from populations import Shape  # noqa: E402


def _rotation(layout: str, sets: int = 3, m: int = 24, n: int = 16, k: int = 40, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    a3 = torch.empty(sets, m, k, dtype=torch.float16).uniform_(-1, 1, generator=gen)
    b_nk = torch.empty(sets, n, k, dtype=torch.float16).uniform_(-1, 1, generator=gen)
    base = RotationReference(a3.clone(), b_nk.clone())
    b3 = b_nk.clone() if layout == "TN" else b_nk.transpose(1, 2).contiguous()
    return gen, a3, b3, base


def _product(a3: torch.Tensor, b3: torch.Tensor, layout: str) -> torch.Tensor:
    b = b3.double().transpose(1, 2) if layout == "TN" else b3.double()
    return torch.bmm(a3.double(), b)


@pytest.mark.parametrize("layout", ["TN", "NN"])
def test_reference_from_base_equals_the_full_product_after_row_and_element_changes(layout):
    gen, a3, b3, base = _rotation(layout)
    a3[:, [2, 7], :] = torch.empty(3, 2, a3.shape[2], dtype=torch.float16).uniform_(-1, 1, generator=gen)
    b3[:, 5, :] = -b3[:, 5, :]          # a whole row of B as stored (TN: a column of C; NN: a k)
    a3[1, 11, 3] = 0.75                  # single elements, one set only
    b3[2, 0, 1] = -0.5
    got = _recheck._reference_from_base(a3, b3, layout, base, 0, a3.shape[0])
    torch.testing.assert_close(got, _product(a3, b3, layout), rtol=0, atol=1e-12)


def test_reference_from_base_is_the_pristine_product_when_nothing_changed():
    _, a3, b3, base = _rotation("TN")
    torch.testing.assert_close(_recheck._reference_from_base(a3, b3, "TN", base, 0, 3), _product(a3, b3, "TN"),
                               rtol=0, atol=0)


@pytest.mark.parametrize("layout", ["TN", "NN"])
def test_recheck_with_the_cached_reference_passes_honest_and_catches_stale_kernels(layout):
    gen, a3, b3, base = _rotation(layout)
    c3 = torch.empty(a3.shape[0], a3.shape[1], b3.shape[1] if layout == "TN" else b3.shape[2], dtype=torch.float16)

    def honest(i: int) -> None:
        c3[i] = _product(a3[i:i + 1], b3[i:i + 1], layout)[0].half()
    recheck_sets(a3, b3, c3, layout, honest, lambda: None, gen, base=base)
    pristine_a, pristine_b = a3.clone(), b3.clone()

    def pristine_inputs(i: int) -> None:  # computes from a copy it took of the inputs: stale where they changed
        c3[i] = _product(pristine_a[i:i + 1], pristine_b[i:i + 1], layout)[0].half()
    with pytest.raises(CheckFailed, match="outputs after timing"):
        recheck_sets(a3, b3, c3, layout, pristine_inputs, lambda: None, gen, base=base)
    with pytest.raises(CheckFailed, match="outputs after timing"):  # C trusted: the recheck's garbage stays
        recheck_sets(a3, b3, c3, layout, lambda i: None, lambda: None, gen, base=base)


def test_cached_reference_still_sees_a_wrong_row_the_recheck_never_changed():
    gen, a3, b3, base = _rotation("TN")
    c3 = torch.empty(3, 24, 16, dtype=torch.float16)

    def wrong_last_row(i: int) -> None:  # right except row 23 of every set, which no pass may touch
        c3[i] = _product(a3[i:i + 1], b3[i:i + 1], "TN")[0].half()
        c3[i, 23] += 1.0
    with pytest.raises(CheckFailed, match="rotation set 0"):
        recheck_sets(a3, b3, c3, "TN", wrong_last_row, lambda: None, gen, base=base)


def test_verify_sets_with_base_names_the_set_and_element():
    _, a3, b3, base = _rotation("TN")
    c3 = _product(a3, b3, "TN").half()
    verify_sets(a3, b3, c3, "TN", "check", "here", base=base)
    c3[2, 4, 9] = 100.0
    with pytest.raises(CheckFailed, match=r"rotation set 2 .*C\[4,9\]"):
        verify_sets(a3, b3, c3, "TN", "check", "here", base=base)


def test_timing_buffers_reference_comes_from_the_pristine_copy_once(monkeypatch):
    import evaluators.run._rotation as h

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (8 << 30, 16 << 30))
    shape = Shape(20, 24, 32, "TN")
    tb = h.TimingBuffers(shape, 0, 1 << 15, torch.device("cpu"))
    m, n, k = shape.m, shape.n, shape.k
    a3 = tb.a_all[:, :m * k].view(tb.n_sets, m, k)
    b3 = tb.bnk_all[:, :n * k].view(tb.n_sets, n, k)
    want = _product(a3, b3, "TN")
    a3[0, 0, 0] = 9.0  # a live input changed before the first request: the reference must not see it
    ref = tb.base_reference()
    assert ref is tb.base_reference()  # made once, kept with the rotation
    torch.testing.assert_close(ref.ref, want, rtol=0, atol=1e-12)
    monkeypatch.setattr(h, "REFERENCE_CACHE_BYTES", 16)
    tb2 = h.TimingBuffers(shape, 0, 1 << 15, torch.device("cpu"))
    assert tb2.base_reference() is None  # over the cap: the recheck computes full products


def test_mm_f32_falls_back_to_float32_off_the_gpu():
    a = torch.empty(5, 7, dtype=torch.float16).uniform_(-3, 3)
    b = torch.empty(7, 4, dtype=torch.float16).uniform_(-3, 3)
    got = _reference._mm_f32(a, b)
    assert got.dtype is torch.float32
    torch.testing.assert_close(got, a.float() @ b.float())
    torch.testing.assert_close(_reference._abs_fp16(a, b), a.float().abs() @ b.float().abs())


def test_integer_reference_declines_where_it_does_not_apply():
    a = torch.randint(-3, 4, (32, 16)).half()
    assert _reference.integer_reference(a, torch.randint(-3, 4, (16, 8)).half()) is None  # CPU: floating point


def _operands(shape: Shape, seed: int):
    gen = torch.Generator().manual_seed(seed)
    return Operands.allocate(shape, 0, False, torch.device("cpu"), gen, guard_bytes=256), gen


def _honest(o: Operands) -> None:
    o.C.data.copy_((o.A.data.double() @ o.b_kn().double()).half())


def test_all_ones_closed_form_passes_honest_and_catches_an_fp16_accumulator():
    shape = Shape(8, 8, 4096, "TN")
    ops, gen = _operands(shape, 1)
    cas = Cascade(ops, _honest, lambda: None, gen)
    cas.all_ones()
    assert cas.checks == [f"all-ones probe (K={shape.k})"]

    def fp16_accumulator(o: Operands) -> None:  # fp16 sums stall at 2048
        o.C.data.fill_(2048.0)
    with pytest.raises(CheckFailed, match="all-ones"):
        Cascade(ops, fp16_accumulator, lambda: None, gen).all_ones()


def test_one_synchronisation_still_reports_a_write_outside_before_wrong_values():
    shape = Shape(16, 8, 24, "TN")
    ops, gen = _operands(shape, 2)

    def stray(o: Operands) -> None:  # wrong values and a store past C
        o.C.data.zero_()
        o.C.full[o.C.band + o.C.n] = 1.0
    with pytest.raises(CheckFailed, match="wrote outside C"):
        Cascade(ops, stray, lambda: None, gen).random()

    def nan_row_missing(o: Operands) -> None:  # computes with the NaN replaced: the planted NaN never arrives
        o.C.data.copy_((torch.nan_to_num(o.A.data.double()) @ torch.nan_to_num(o.b_kn().double())).half())
    ops, gen = _operands(shape, 3)  # fresh canaries: the stray store above stays in the old ones
    with pytest.raises(CheckFailed, match="did not reach all of row"):
        Cascade(ops, nan_row_missing, lambda: None, gen).planted_nan()
    cas = Cascade(ops, _honest, lambda: None, gen, placements=random.Random(0))
    cas.full(True)
    assert len(cas.checks) >= 7 and cas.max_error < 1e-2


# -- GPU: the tensor-core and int8 paths against float64 -----------------------------------------
@pytest.mark.gpu
def test_gpu_fast_paths_match_float64_at_a_float32_reference_shape():
    """At a shape whose references run in float32 (over FP64_LIMIT multiply-adds): the fp16
    tensor-core scales are within 1e-4 of float64's, the int8 reference of the special-values
    probe is float64's exactly, and a rotation's cached reference with changed rows and
    columns recomputed is the float32 full product's within float32 rounding."""
    dev = torch.device("cuda")
    m, n, k = 2048, 1024, 8192
    assert m * n * k > _reference.FP64_LIMIT
    g = torch.Generator(device=dev).manual_seed(7)
    a = torch.empty(m, k, dtype=torch.float16, device=dev).uniform_(-1, 1, generator=g)
    b = torch.empty(k, n, dtype=torch.float16, device=dev).uniform_(-1, 1, generator=g)
    s64 = a.double().abs() @ b.double().abs()
    t64 = (a.double().square() @ b.double().square()).sqrt()
    assert float(((_reference._abs_fp16(a, b).double() - s64).abs() / s64).max()) < 1e-4
    assert float(((_reference._rss_fp16(a, b).double() - t64).abs() / t64).max()) < 1e-3  # squares rounded to fp16
    ai = torch.randint(-3, 4, (m, k), generator=g, device=dev).half()
    bi = torch.randint(-3, 4, (k, n), generator=g, device=dev).half()
    ai[:, 100:300] = 0
    bi[:, :64] = 1.0
    got = _reference.integer_reference(ai, bi)
    assert got is not None, "the int8 GEMM path was refused on this GPU"
    assert torch.equal(got[0].double(), ai.double() @ bi.double())
    assert torch.equal(got[1].double(), ai.double().abs() @ bi.double().abs())
    sets = 2
    a3 = torch.empty(sets, m, k, dtype=torch.float16, device=dev).uniform_(-1, 1, generator=g)
    b3 = torch.empty(sets, n, k, dtype=torch.float16, device=dev).uniform_(-1, 1, generator=g)
    base = RotationReference(a3.clone(), b3.clone())
    a3[:, [5, 900], :] = -a3[:, [5, 900], :]
    b3[1, 17, 3] = 0.25
    ref = _recheck._reference_from_base(a3, b3, "TN", base, 0, sets)
    full = torch.bmm(a3.float(), b3.float().transpose(1, 2))
    scale = (a3.float().abs() @ b3.float().abs().transpose(1, 2))
    assert float(((ref - full).abs() / scale).max()) < 1e-5
