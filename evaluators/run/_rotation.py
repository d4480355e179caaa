"""The timing rotation: the input/output sets a candidate is timed on (more than 2x L2, guarded,
kept with their pristine copies), the perturbation before every timed replay and the check of the
timed outputs. Used by the timing phase (:mod:`._timing`)."""
from __future__ import annotations

import random
from typing import Any, Callable, Optional

import torch

from populations import Shape

from ..correctness import FP64_LIMIT, Guarded, RotationReference, verify_sets, workspace_fill
from ._timers import rotation_sets


#: Canary bytes per side of the timing rotation's stacks and workspaces.
ROTATION_GUARD_BYTES = 64 << 10


def _perturber(tb: "TimingBuffers", shape: Shape, workspaces: Optional[torch.Tensor],
               rng: random.Random) -> Callable[[], None]:
    """What runs before every timed replay (outside the timed events): one element of every row
    of every set's A changes sign, at columns drawn at random each time
    (:meth:`TimingBuffers.flip_rows`; a fixed stride is a pattern a kernel can recognise from its
    inputs, and a single changed element left most of C reusable), and a non-zeroed workspace is
    refilled with a byte drawn as for the checked calls
    (:func:`evaluators.correctness.workspace_fill`), so that nothing a kernel leaves there
    survives to the next call or tells timing from checking."""
    gen = torch.Generator(device=tb.a_all.device).manual_seed(rng.getrandbits(62))

    def perturb() -> None:
        tb.flip_rows(gen)
        if workspaces is not None:
            workspaces.fill_(workspace_fill(rng))
    return perturb


#: The timed-output check verifies this many rows drawn at random (every row changed since the
#: last call: an output kept from it is stale in all of them) on at most ``TIMED_CHECK_SETS``
#: rotation sets drawn at random: which ones is unknown to the kernel, and the reference costs a
#: few percent of a full one at 4096^3 (the recheck after timing, which follows, still verifies
#: every element of every set).
TIMED_CHECK_ROWS, TIMED_CHECK_SETS = 64, 256


def _check_timed(graph: Any, perturb: Callable[[], None], tb: "TimingBuffers", shape: Shape, where: str,
                 sync: Callable[[], None], rng: random.Random) -> None:
    """Verify the outputs of the timed calls: one more replay of the timed graph (every set into
    its own C, after the same random perturbation as every timed replay, with C holding the last
    replay's outputs as it does between timed replays: nothing tells it from the others), then
    random rows of random sets checked against the current inputs. Raises :class:`CheckFailed`
    naming the set."""
    perturb()
    graph.replay()
    sync()
    m, n, k, sets = shape.m, shape.n, shape.k, tb.n_sets
    rows = sorted(rng.sample(range(m), TIMED_CHECK_ROWS)) if m > 4 * TIMED_CHECK_ROWS else list(range(m))
    picked = sorted(rng.sample(range(sets), min(sets, TIMED_CHECK_SETS)))
    dev = tb.a_all.device
    r_idx, s_idx = torch.tensor(rows, device=dev), torch.tensor(picked, device=dev)
    a3 = tb.a_all[:, :m * k].view(sets, m, k).index_select(0, s_idx).index_select(1, r_idx)
    b = tb.bnk_all[:, :n * k].view(sets, n, k) if shape.layout == "TN" else tb.bkn_all[:, :k * n].view(sets, k, n)
    c3 = tb.cc_all[:, :m * n].view(sets, m, n).index_select(0, s_idx).index_select(1, r_idx)
    verify_sets(a3, b.index_select(0, s_idx), c3, shape.layout, "timed calls verified", where,
                "is wrong on a replay of the timed graph (checked calls were right)", set_ids=picked, row_ids=rows)


class TimingBuffers:
    """Rotating input/output sets for one shape (more than 2x L2 in total), filled once from a
    fixed seed so that repeated measurements of a kernel see the same data, plus the captured
    baseline graphs over them. Each stack is a :class:`Guarded` block from ``alloc`` (in the
    worker a VA reservation with unmapped gaps), allocated in a fixed order; its canaries are
    part of :meth:`intact`."""

    SEED = 0x5EED

    def __init__(self, shape: Shape, ws: int, l2: int, device: torch.device,
                 alloc: Optional[Callable[[int], torch.Tensor]] = None) -> None:
        m, n, k = shape.m, shape.n, shape.k
        free, _ = torch.cuda.mem_get_info()
        per_set = 2 * (2 * m * k + 4 * n * k + 2 * m * n) + ws + 6 * 256  # inputs, pristine copies, outputs
        self.n_sets = n_sets = max(2, min(rotation_sets(2 * (m * k + n * k + m * n), l2), int(0.4 * free) // per_set))
        gen = torch.Generator(device=device).manual_seed(self.SEED)
        canary_gen = torch.Generator(device=device).manual_seed(self.SEED + 1)
        self._guards: list[Guarded] = []

        place_rng = random.Random(self.SEED)
        gapped = bool(getattr(getattr(alloc, "__self__", None), "gap_bytes", 0))

        def stack(rows: int, cols: int, aligned: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
            """Inputs start on a 2 MiB boundary (as fresh large allocations do), outputs at a fixed
            pseudo-random offset: over the sets, address bits and alignments of A, B and C vary."""
            stride = -(-rows * cols // 128) * 128  # 256-byte aligned sets
            g = Guarded(n_sets, stride, device, canary_gen, guard_bytes=ROTATION_GUARD_BYTES, alloc=alloc, movable=True)
            g.place(aligned, place_rng, gapped)
            self._guards.append(g)
            flat = g.data
            return flat, [flat[i, :rows * cols].view(rows, cols) for i in range(n_sets)]

        self.a_all, self.a = stack(m, k, True)
        self.a_all.uniform_(-1, 1, generator=gen)
        self.bnk_all, self.b_nk = stack(n, k, True)
        self.bnk_all.uniform_(-1, 1, generator=gen)
        self.bkn_all, self.b_kn = stack(k, n, True)
        for i in range(n_sets):
            self.b_kn[i].copy_(self.b_nk[i].t())
        self.cc_all, self.cc = stack(m, n, False)
        self.cb_all, self.cb = stack(m, n, False)
        self.graphs: dict[str, Any] = {}
        self._inputs = [t.view(torch.int16) for t in (self.a_all[:, :m * k], self.bnk_all[:, :n * k],
                                                      self.bkn_all[:, :k * n])]
        self._pristine = [t.clone() for t in self._inputs]
        self._flipped: set[int] = set()
        self._row_flips: list[torch.Tensor] = []
        self._mk, self._n = (m, k), n
        self._reference: Optional[RotationReference] = None

    def pointers(self, layout: str, workspaces: torch.Tensor) -> list[dict[str, int]]:
        """Every set's A, B (as stored for ``layout``), C and workspace (row ``i`` of
        ``workspaces``) addresses, from each stack's base and row stride (one ``data_ptr`` per
        stack instead of four per set: 4096 sets at tiny shapes)."""
        def rows(t: torch.Tensor) -> list[int]:
            base, step = t.data_ptr(), t.stride(0) * t.element_size()
            return [base + step * i for i in range(self.n_sets)]
        b_all = self.bnk_all if layout == "TN" else self.bkn_all
        return [{"A": a, "B": b, "C": c, "workspace": w}
                for a, b, c, w in zip(rows(self.a_all), rows(b_all), rows(self.cc_all), rows(workspaces))]

    def flip(self, p: int) -> None:
        """Change the sign of element ``p`` of every set's A."""
        self.a_all[:, p].neg_()
        self._flipped ^= {p}

    def flip_rows(self, gen: torch.Generator) -> None:
        """The timers' input perturbation: change the sign of one element in every row of every
        set's A, at a column drawn at random per row and call. Every output element changes, so
        an output kept from an earlier call (C as memory) is stale everywhere, and which element
        of a row changed cannot be found without redoing the row's work."""
        m, k = self._mk
        if getattr(self, "_row_base", None) is None:
            self._row_base = torch.arange(m, device=self.a_all.device) * k
        pos = self._row_base + torch.randint(0, k, (m,), device=self.a_all.device, generator=gen)
        self.a_all[:, pos] = self.a_all[:, pos].neg()
        self._row_flips.append(pos)

    def unflip(self) -> None:
        """Undo every pending :meth:`flip` and :meth:`flip_rows`: the inputs are bit-identical to
        the pristine copy again (sign changes commute and undo themselves)."""
        for p in self._flipped:
            self.a_all[:, p].neg_()
        self._flipped.clear()
        for pos in self._row_flips:
            self.a_all[:, pos] = self.a_all[:, pos].neg()
        self._row_flips.clear()

    def intact(self) -> bool:
        """Bit-exact comparison of the inputs with their pristine copy (after :meth:`unflip`), and
        every stack's canaries: False when a candidate wrote into them, in place (its own A or B)
        or by a far store (the other cached rotations are the harness's other large live
        buffers, so they double as canaries). Every comparison is queued first and read in one
        synchronisation."""
        if self._flipped or self._row_flips:
            return False
        changed = [(t != q).any() for t, q in zip(self._inputs, self._pristine)] + [g.guards_changed() for g in self._guards]
        return not any(torch.stack(changed).tolist())

    def base_reference(self) -> Optional[RotationReference]:
        """The rotation's reference from its pristine copies (:class:`RotationReference`), made at
        the first call and kept with the rotation, so that the recheck after timing does not
        recompute every set's full product for every candidate; None when it would take more
        than :data:`REFERENCE_CACHE_BYTES` (the recheck then computes full products)."""
        if self._reference is None:
            (m, k), n, sets = self._mk, self._n, self.n_sets
            esize = 8 if m * n * k <= FP64_LIMIT else 4
            if sets * m * n * esize > REFERENCE_CACHE_BYTES:
                return None
            self._reference = RotationReference(self._pristine[0].view(torch.float16).view(sets, m, k),
                                                self._pristine[1].view(torch.float16).view(sets, n, k))
        return self._reference


#: Most bytes a rotation's cached reference (:meth:`TimingBuffers.base_reference`) may take.
REFERENCE_CACHE_BYTES = 1 << 30
