"""Checked calls meet both kinds of buffer placement (issue 5, found on the H200 2026-11-30): with
VA-reserved blocks every operand sat at one fixed offset, so the red team's
``pointer_alignment_cheat`` (half of K when A, B and C are 2 MiB aligned) and
``pointer_hash_cheat`` (half of K when bit 21 of A ^ C is set) were never tempted and passed as
``ok``. The cascade now moves the operands between checks (2 MiB-aligned and random placements
alternate) and the timing rotation puts inputs on 2 MiB boundaries and outputs elsewhere. Python
stand-ins of those kernels run through the real cascade on CPU tensors; the allocator is a test
double of the VA-reserved one (whole blocks that start on a 2 MiB boundary)."""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from evaluators.correctness import PLACEMENT_ALIGN, Cascade, CheckFailed, Guarded, Operands  # noqa: E402
from populations import Shape  # noqa: E402

_keep: list = []


def block_alloc(nbytes: int) -> "torch.Tensor":
    """Test double of VmmAllocator.bytes: a 2 MiB-aligned block of whole 2 MiB granules."""
    size = -(-nbytes // PLACEMENT_ALIGN) * PLACEMENT_ALIGN
    raw = torch.empty(size + PLACEMENT_ALIGN, dtype=torch.uint8)
    _keep.append(raw)
    off = (-raw.data_ptr()) % PLACEMENT_ALIGN
    return raw[off:off + size]


def _kernel(ops: Operands, half_k: bool) -> None:
    a, c = ops.A.data, ops.C.data
    b = ops.b_kn()
    k = a.shape[1] // 2 if half_k else a.shape[1]
    c.copy_((a[:, :k].double() @ b[:k].double()).half())


def aligned_cheat(ops: Operands) -> None:  # pointer_alignment_cheat.cu
    _kernel(ops, (ops.A.ptr | ops.B.ptr | ops.C.ptr) % PLACEMENT_ALIGN == 0)


def hash_cheat(ops: Operands) -> None:  # pointer_hash_cheat.cu
    _kernel(ops, bool(((ops.A.ptr ^ ops.C.ptr) >> 21) & 1))


def _cascade(call, seed: int, placements: bool = True) -> Cascade:
    gen = torch.Generator().manual_seed(seed)
    ops = Operands.allocate(Shape(64, 48, 256, "TN"), 0, False, torch.device("cpu"), gen, 1 << 16, block_alloc,
                            movable=True)
    return Cascade(ops, call, lambda: None, gen, placements=random.Random(seed) if placements else None, gapped=True)


@pytest.mark.parametrize("cheat", [aligned_cheat, hash_cheat], ids=["alignment", "address_bit_21"])
@pytest.mark.parametrize("seed", range(3))
def test_placement_keyed_cheats_fail_the_cascade(cheat, seed):
    with pytest.raises(CheckFailed):
        _cascade(cheat, seed).full(False)


def test_without_moves_the_alignment_cheat_is_never_tempted():
    """The hole as it was: fixed placement past a canary band, never 2 MiB aligned."""
    _cascade(aligned_cheat, 0, placements=False).full(False)


def test_an_honest_kernel_passes_at_every_placement():
    seen = set()

    def honest(ops):
        seen.add((ops.A.ptr % PLACEMENT_ALIGN == 0, ops.C.ptr % PLACEMENT_ALIGN == 0))
        _kernel(ops, False)
    _cascade(honest, 1).full(False)
    assert (True, True) in seen and (False, False) in seen


def test_moving_the_window_keeps_canaries_around_it():
    gen = torch.Generator().manual_seed(2)
    g = Guarded(8, 8, torch.device("cpu"), gen, guard_bytes=4096, alloc=block_alloc, movable=True)
    rng = random.Random(3)
    for aligned in (True, False, True, False):
        g.place(aligned, rng, gapped=not aligned)
        assert (g.ptr % PLACEMENT_ALIGN == 0) == aligned or not aligned
        assert g.guards_intact()
        g.data.fill_(2.0)
        assert g.guards_intact()
        g.full[g.band + g.data.numel()] = 3.0  # one element past the window
        assert not g.guards_intact()
        g.full[g.band + g.data.numel()] = float("nan")


def test_timing_rotation_puts_inputs_on_2mib_boundaries_and_outputs_elsewhere(monkeypatch):
    import evaluators.run._rotation as h

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (8 << 30, 16 << 30))

    class _Alloc:  # what the harness passes: a bound method whose owner says whether gaps exist
        gap_bytes = 2 << 30

        def bytes(self, n):
            return block_alloc(n)
    tb = h.TimingBuffers(Shape(40, 24, 32, "TN"), 0, 1 << 15, torch.device("cpu"), _Alloc().bytes)
    assert tb.a[0].data_ptr() % PLACEMENT_ALIGN == 0 and tb.b_nk[0].data_ptr() % PLACEMENT_ALIGN == 0
    assert tb.cc[0].data_ptr() % PLACEMENT_ALIGN != 0
    bits = {((tb.a[i].data_ptr() ^ tb.cc[i].data_ptr()) >> 21) & 1 for i in range(tb.n_sets)}
    assert tb.intact() and tb.n_sets >= 2
    assert bits  # recorded; with more sets than one granule both values occur (see the red team)
