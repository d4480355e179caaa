"""The class-cover instances checked together (evaluators/correctness/_cover.py), on the CPU.

The candidate's launch is replaced by Python stand-ins (test doubles of a compiled kernel, which
only a GPU runs) that compute C from the operands they are handed, right or in one of the ways a
kernel goes wrong; the block, its canaries, the fills, the snapshot, the batched reference and
the verdicts are the real code."""
from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from evaluators.correctness import PLACEMENT_ALIGN, CheckFailed, CoverItem, check_cover, class_cover  # noqa: E402
from populations import Shape  # noqa: E402

GUARD = 64 << 10


def _product(o, acc16: bool = False, skip_last: bool = False) -> torch.Tensor:
    a, b = o.A.data.double(), o.b_kn().double()
    if skip_last:
        a, b = a[:, :-1], b[:-1]
    if acc16:  # fp16 accumulation, one k at a time
        acc = torch.zeros(a.shape[0], b.shape[1], dtype=torch.float16)
        for k in range(a.shape[1]):
            acc = (acc.double() + torch.outer(a[:, k], b[k])).half()
        return acc
    return (a @ b).half()


def _good(o) -> None:
    o.C.data.copy_(_product(o))


def _items(fn, layout: str = "TN", seed: int = 0, ws: int = 0, pitch: frozenset = frozenset()) -> list[CoverItem]:
    claim = Shape(512, 512, 1024, layout)
    return [CoverItem(s, ws, fn) for s in class_cover(claim, set(pitch), random.Random(seed))]


def _check(items, seed: int = 1, zero_ws: bool = False):
    return check_cover(items, zero_ws, torch.device("cpu"), torch.Generator().manual_seed(seed), random.Random(seed),
                       lambda: None, guard_bytes=GUARD)


@pytest.mark.parametrize("layout", ["TN", "NN"])
def test_an_honest_kernel_passes_every_class_with_one_check_each(layout: str) -> None:
    items = _items(_good, layout)
    got = _check(items)
    assert len(got.checks) == len(items) == 16 and set(got.checks) == {"random inputs"}
    assert 0 < got.max_error < 0.06


def test_windows_are_apart_fenced_and_placed_both_ways_and_called_in_random_order() -> None:
    seen: list[tuple[Shape, dict]] = []

    def record(o) -> None:
        seen.append((o.shape, o.pointers()))
        _good(o)
    items = _items(record, ws=4096)
    _check(items, seed=3)
    spans = sorted((p[name], p[name] + nbytes) for s, p in seen
                   for name, nbytes in (("A", 2 * s.m * s.k), ("B", 2 * s.n * s.k), ("C", 2 * s.m * s.n), ("workspace", 4096)))
    assert all(lo2 - hi1 >= GUARD for (_, hi1), (lo2, _) in zip(spans, spans[1:]))  # a canary between any two
    assert all(lo % 256 == 0 for lo, _ in spans)
    aligned = [all(p[n] % PLACEMENT_ALIGN == 0 for n in p) for _, p in seen]
    assert sum(aligned) in (8, 9) and not all(aligned)  # half the instances on 2 MiB boundaries
    order = [s for s, _ in seen]
    seen.clear()
    _check(items, seed=4)
    assert [s for s, _ in seen] != order and sorted(map(str, order)) == sorted(str(s) for s, _ in seen)


def _write_past_c(o) -> None:
    _good(o)
    flat = o.C.data.view(-1)
    torch.as_strided(flat, (1,), (1,), flat.storage_offset() + flat.numel() + 3).fill_(1.0)  # past the end


def _write_before_a(o) -> None:
    _good(o)
    base = o.A.data.view(torch.uint8).view(-1)
    torch.as_strided(base, (1,), (1,), base.storage_offset() - 100).add_(1)  # 100 bytes before A


def _modify_a(o) -> None:
    _good(o)
    o.A.data[0, 0] = 0.25


def _leave_last_row(o) -> None:
    o.C.data[:-1].copy_(_product(o)[:-1])


def _wrong_when_mn_aligned_k_ragged(o) -> None:
    s = o.shape
    o.C.data.copy_(_product(o, skip_last=s.m % 8 == 0 and s.n % 8 == 0 and s.k % 8 != 0))


def _scribble_workspace(o) -> None:  # a workspace is the kernel's to write
    o.W.data.fill_(0x11)
    _good(o)


@pytest.mark.parametrize("fn, expect", [
    (lambda o: o.C.data.copy_(_product(o, acc16=True)), "random inputs: .*outside tolerance"),
    (lambda o: o.C.data.copy_(_product(o, skip_last=True)), "outside tolerance"),
    (_write_past_c, "wrote outside C"),
    (_write_before_a, "wrote outside A"),
    (_modify_a, "modified input"),
    (_leave_last_row, "left NaN|left holding the poison"),
    (_wrong_when_mn_aligned_k_ragged, r"outside tolerance.* on ragged instance \d+x\d+x\d+"),
], ids=["fp16-accumulation", "skips-last-k", "writes-past-C", "writes-before-A", "modifies-A", "leaves-a-row",
        "one-class-wrong"])
def test_each_way_of_being_wrong_is_caught_and_named(fn, expect: str) -> None:
    with pytest.raises(CheckFailed, match=expect) as info:
        _check(_items(fn, ws=512))
    if "ragged instance" in expect:  # the instance named is of the class that is wrong
        dims = [int(d) for d in info.value.args[0].rsplit(" ", 1)[1].split("x")]
        assert dims[0] % 8 == 0 and dims[1] % 8 == 0 and dims[2] % 8 != 0


def test_the_workspace_is_the_kernels_and_is_filled_per_call() -> None:
    got = _check(_items(_scribble_workspace, ws=1024))
    assert len(got.checks) == 16
    fills: set[int] = set()

    def look(o) -> None:
        fills.add(int(o.W.data[0, 0]))
        assert bool((o.W.data == o.W.data[0, 0]).all())
        _good(o)
    _check(_items(look, ws=1024), seed=5)
    assert len(fills) >= 2 and 0 not in fills
    zeroed: set[int] = set()
    _check(_items(lambda o: (zeroed.add(int(o.W.data.max())), _good(o)), ws=1024), seed=6, zero_ws=True)
    assert zeroed == {0}


def test_outputs_start_poisoned_with_nan_or_finite_values_per_instance() -> None:
    kinds: list[str] = []

    def look(o) -> None:
        kinds.append("nan" if bool(torch.isnan(o.C.data).all()) else "finite")
        _good(o)
    _check(_items(look), seed=8)
    assert set(kinds) == {"nan", "finite"}
