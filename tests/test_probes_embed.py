"""The hidden cancellation (evaluators.correctness.embed_cancellation) writes by slices in each
operand's memory order; these tests hold it to its definition, written here as scatters through
the partners' indices (the form it had before: the same values, at every K, in both layouts)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from evaluators.correctness import embed_cancellation  # noqa: E402


def _signs(n: int, gen: "torch.Generator") -> "torch.Tensor":
    return (torch.randint(0, 2, (n,), generator=gen) * 2 - 1).half()


def by_definition(a: "torch.Tensor", b_kn: "torch.Tensor", gen: "torch.Generator") -> "torch.Tensor":
    """The test by its definition: k < h and its partner h + perm[k] share B's row; A's partner
    element is the negation, on a quarter of A's rows (the same random draws, in the same order)."""
    m, k = a.shape[-2], a.shape[-1]
    n, h = b_kn.shape[-1], k // 2
    first = torch.arange(h)
    partner = h + torch.randperm(h, generator=gen)
    t, u = _signs(h, gen), _signs(n, gen)
    coherent = b_kn[..., first, :].abs() * t[:, None] * u[None, :]
    b_kn[..., first, :] = coherent
    b_kn[..., partner, :] = coherent
    picked = torch.randperm(m, generator=gen)[: max(1, m // 4)]
    s = _signs(len(picked), gen)
    lead = a[..., picked, :h].abs() * s[:, None] * t[None, :]
    a[..., picked, :h] = lead
    a[..., picked[:, None], partner[None, :]] = -lead
    return picked


@pytest.mark.parametrize("layout", ["TN", "NN"])
@pytest.mark.parametrize("sets,m,n,k", [(1, 7, 9, 2), (2, 13, 24, 3), (3, 40, 16, 64), (2, 33, 1, 129), (1, 1, 8, 17)])
def test_slices_give_what_the_definition_gives(layout, sets, m, n, k):
    g = torch.Generator().manual_seed(sets * 1000 + m * 7 + k)
    a = torch.empty(sets, m, k).uniform_(-1, 1, generator=g).half()
    stored = torch.empty(sets, n, k).uniform_(-1, 1, generator=g).half() if layout == "TN" else \
        torch.empty(sets, k, n).uniform_(-1, 1, generator=g).half()
    a2, stored2 = a.clone(), stored.clone()
    view = (lambda t: t.transpose(1, 2)) if layout == "TN" else (lambda t: t)  # B as K x N
    rows = embed_cancellation(a, view(stored), torch.Generator().manual_seed(5))
    rows2 = by_definition(a2, view(stored2), torch.Generator().manual_seed(5))
    assert torch.equal(rows, rows2) and torch.equal(a, a2) and torch.equal(stored, stored2)
    c = (a.double() @ view(stored).double())[:, rows, :]
    last = a.double()[:, rows, k - 1:] * view(stored).double()[:, None, k - 1, :] if k % 2 else 0.0
    assert torch.equal(c - last, torch.zeros_like(c))  # the carrying rows cancel exactly (an odd K's last term aside)
