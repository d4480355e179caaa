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


@pytest.mark.parametrize("layout", ["TN", "NN"])
@pytest.mark.parametrize("m,n,k", [(13, 24, 3), (40, 16, 64), (33, 1, 129), (1, 8, 17)])
def test_draws_made_per_candidate_hide_an_exact_cancellation(layout, m, n, k):
    """The timers draw the hidden test once per candidate (cancellation_draws, several copies in
    bulk) and hide it with one of them: every copy is a valid test (partners a permutation, signs
    +-1, distinct carrying rows) and its rows cancel exactly, in both layouts; copies differ."""
    from evaluators.correctness import cancellation_draws

    g = torch.Generator().manual_seed(m * 31 + k)
    draws = cancellation_draws(m, n, k, g, copies=4)
    h, count = k // 2, max(1, m // 4)
    assert len(draws) == 4
    for d in draws:
        assert torch.equal(d.perm.sort().values, torch.arange(h))
        assert d.picked.numel() == count and d.picked.unique().numel() == count and int(d.picked.max()) < m
        for signs, size in ((d.t, h), (d.u, n), (d.s, count)):
            assert signs.dtype == torch.float16 and signs.numel() == size and bool((signs.abs() == 1).all())
        a = torch.empty(2, m, k).uniform_(-1, 1, generator=g).half()
        stored = torch.empty(2, n, k).uniform_(-1, 1, generator=g).half() if layout == "TN" else \
            torch.empty(2, k, n).uniform_(-1, 1, generator=g).half()
        view = (lambda t: t.transpose(1, 2)) if layout == "TN" else (lambda t: t)
        rows = embed_cancellation(a, view(stored), draws=d)
        assert torch.equal(rows, d.picked)
        c = (a.double() @ view(stored).double())[:, rows, :]
        last = a.double()[:, rows, k - 1:] * view(stored).double()[:, None, k - 1, :] if k % 2 else 0.0
        assert torch.equal(c - last, torch.zeros_like(c))
    if h > 1:
        assert not all(torch.equal(draws[0].perm, d.perm) for d in draws[1:])


def test_embed_needs_a_generator_or_draws():
    a, b = torch.zeros(1, 4, 4).half(), torch.zeros(1, 4, 4).half()
    with pytest.raises(ValueError, match="gen or draws"):
        embed_cancellation(a, b)
