"""The timing rotation: the input/output sets a candidate is timed on (more than 2x L2, guarded,
kept with their pristine copies), the perturbation before every timed replay and the check of the
timed outputs. Used by the timing phase (:mod:`._timing`)."""
from __future__ import annotations

import random
from typing import Any, Callable, Optional

import torch

from populations import Shape

from ..correctness import (FP64_LIMIT, POISONS, CancellationDraws, CheckFailed, Guarded, RotationReference,
                           cancellation_draws, embed_cancellation, poison_, scramble_, scramble_mask, verify_sets,
                           workspace_fill)
from ._timers import rotation_sets


#: Canary bytes per side of the timing rotation's stacks and workspaces.
ROTATION_GUARD_BYTES = 64 << 10


#: Canary bytes after every set's workspace row in the timing rotation.
ROW_GUARD_BYTES = 256


class WorkspaceRows:
    """Every timing set's workspace row, each followed by a band of random canary bytes, all in
    one :class:`Guarded` block (canaries before the first and after the last). A plan without a
    workspace still gets a 256-byte row per set (its pointer is what the call passes as
    ``workspace``): the row is poisoned between timed replays like any workspace (see
    :func:`_perturber`) and guarded like one, so it neither carries state between calls nor
    hides a stray store into the next set's row."""

    def __init__(self, n_sets: int, ws: int, device: torch.device, gen: torch.Generator, fill: int,
                 alloc: Optional[Callable[[int], torch.Tensor]] = None) -> None:
        row = max(ws, 1) + 255 >> 8 << 8
        self.guard = Guarded(n_sets, row + ROW_GUARD_BYTES, device, gen, torch.uint8,
                             guard_bytes=ROTATION_GUARD_BYTES, alloc=alloc)
        self.rows = self.guard.data[:, :row]
        self._bands = self.guard.data[:, row:]
        self._pattern = self._bands.clone()
        self.rows.fill_(fill)

    def changed(self) -> torch.Tensor:
        """True (a 0-d bool tensor, no sync) when any canary, between rows or around them, changed."""
        return torch.logical_or(self.guard.guards_changed(), (self._bands != self._pattern).any())

    def intact(self) -> bool:
        return not bool(self.changed())


#: Chance that a perturbation also hides the cancellation test in a random run of sets
#: (:meth:`TimingBuffers.embed`), and that it poisons the outputs of a random run of sets
#: (:meth:`TimingBuffers.poison_outputs`): timed calls meet both as checked calls do, and the
#: checked replay after timing (:func:`_check_timed`) is one of them.
EMBED_CHANCE, POISON_CHANCE = 0.25, 0.25


#: Draws of the hidden cancellation test made per candidate (at its first perturbation that hides
#: it); each hiding uses one of them at random, in a run of sets drawn at random.
EMBED_DRAWS = 16


class Perturbation:
    """What runs before every timed replay (outside the timed events): every element of every
    set's A or B (as stored for the layout, one drawn at random) is scrambled
    (:meth:`TimingBuffers.scramble`: sign, magnitude within 4x and digits drawn at random, so an
    output kept from an earlier call cannot be updated for less than a full product), at random
    the cancellation test is hidden in some sets (:meth:`embed`) and some sets' C are poisoned (the device
    timer's replays rewrite every set; the host timers, which call single sets, perturb the
    one they call next: :func:`_set_perturber`), and the workspace rows
    (``workspaces``: every row a kernel can reach, the 256-byte rows of a plan without a
    workspace included; None where the call zeroes them itself) are refilled with a byte drawn
    as for the checked calls (:func:`evaluators.correctness.workspace_fill`), so that nothing a
    kernel leaves there survives to the next call or tells timing from checking.

    Everything here is device work launched from the host: no host tensor op, no copy and no
    synchronisation. The hidden test's draws are made once per candidate, :data:`EMBED_DRAWS` of
    them in a few launches (:func:`evaluators.correctness.cancellation_draws`). Drawing them per
    hiding on the host (to spare the device's sorts) cost 5 ms a time inside the GPU worker at
    4096^3, where compiler children keep the cores busy and torch's host thread pool waited for
    them: the perturbation's host time was half of the timed rounds' wall time (issue 36)."""

    def __init__(self, tb: "TimingBuffers", shape: Shape, workspaces: Optional[torch.Tensor],
                 rng: random.Random) -> None:
        self.tb, self.shape, self.workspaces, self.rng = tb, shape, workspaces, rng
        self.gen = torch.Generator(device=tb.a_all.device).manual_seed(rng.getrandbits(62))
        self._draws: list[CancellationDraws] = []

    def __call__(self) -> None:
        self.tb.scramble(self.gen, self.rng, self.shape.layout)
        if self.rng.random() < EMBED_CHANCE:
            self.embed()
        if self.rng.random() < POISON_CHANCE:
            self.tb.poison_outputs(self.gen, self.rng, self.shape)
        if self.workspaces is not None:
            self.workspaces.fill_(workspace_fill(self.rng))

    def embed(self) -> None:
        """Hide the cancellation test in a random run of sets (:meth:`TimingBuffers.embed`) with
        one of this candidate's draws, drawn at random (the draws are made at the first call)."""
        if not self._draws:
            m, n, k = self.shape.m, self.shape.n, self.shape.k
            self._draws = cancellation_draws(m, n, k, self.gen, EMBED_DRAWS)
        self.tb.embed(self.gen, self.rng, self.shape, draws=self._draws[self.rng.randrange(len(self._draws))])


def _perturber(tb: "TimingBuffers", shape: Shape, workspaces: Optional[torch.Tensor],
               rng: random.Random) -> Perturbation:
    """The device timer's perturbation for one candidate (:class:`Perturbation`)."""
    return Perturbation(tb, shape, workspaces, rng)


def _set_perturber(tb: "TimingBuffers", shape: Shape, workspaces: Optional[torch.Tensor],
                   rng: random.Random) -> Callable[[int], None]:
    """The host timers' perturbation: ``perturb(i)`` runs before their call on set ``i`` alone:
    that set's A or B scrambled as :func:`_perturber` scrambles every set's (an output kept
    from an earlier call is stale everywhere, so memoisation cannot flatter the host figures),
    its workspace row refilled. The other sets, which the call does not read, are left alone.
    Neither the cancellation test nor C's poison: a host-timed output is never verified (the
    recheck after timing calls every set again on restored inputs), so a test hidden there
    would test nothing, and embedding it cost 0.6 ms of host time a time (at 4096^3 the whole
    perturbation was 0.7 ms of each host-timed call, issue 36)."""
    gen = torch.Generator(device=tb.a_all.device).manual_seed(rng.getrandbits(62))

    def perturb(i: int) -> None:
        tb.scramble(gen, rng, shape.layout, sets=(i, i + 1))
        if workspaces is not None:
            workspaces[i].fill_(workspace_fill(rng))
    return perturb


#: The timed-output check verifies this many rows drawn at random (every row changed since the
#: last call: an output kept from it is stale in all of them) on at most ``TIMED_CHECK_SETS``
#: rotation sets drawn at random: which ones is unknown to the kernel, and the reference costs a
#: few percent of a full one at 4096^3 (the recheck after timing, which follows, still verifies
#: every element of every set).
TIMED_CHECK_ROWS, TIMED_CHECK_SETS = 64, 256


def _check_timed(graph: Any, perturb: Perturbation, tb: "TimingBuffers", shape: Shape, where: str,
                 sync: Callable[[], None], rng: random.Random) -> None:
    """Verify the outputs of the timed calls: one more replay of the timed graph (every set into
    its own C, after the same random perturbation as every timed replay, the cancellation test
    hidden in a random run of sets as it is in random timed replays, with C holding the last
    replay's outputs or poison as it does between timed replays: nothing tells it from the
    others), then random rows of random sets (the embedded ones among them) checked against the
    current inputs with the stricter of both tolerances (the rows carrying the hidden test with
    the exact one). Raises :class:`CheckFailed` naming the set."""
    perturb()
    perturb.embed()  # recorded in tb.coherent, with any the perturbation hid
    live = [t.clone() for t in tb.live_inputs(shape.layout)]  # restoring from the pristine copy erases changes
    graph.replay()
    sync()
    if not all(torch.equal(t, q) for t, q in zip(tb.live_inputs(shape.layout), live)):
        raise InputsModified("timed calls verified", f"{where}: modified input A or B in place during a timed replay")
    del live
    m, n, k, sets = shape.m, shape.n, shape.k, tb.n_sets
    coherent = {i: r.tolist() for i, r in tb.coherent.items()}  # every run the test is hidden in now
    rows = sorted(rng.sample(range(m), TIMED_CHECK_ROWS)) if m > 4 * TIMED_CHECK_ROWS else list(range(m))
    rows = sorted(set(rows) | {r for rs in coherent.values() for r in rs[:TIMED_CHECK_ROWS]})
    picked = sorted(set(rng.sample(range(sets), min(sets, TIMED_CHECK_SETS))) | set(list(coherent)[:TIMED_CHECK_SETS]))
    at = {r: i for i, r in enumerate(rows)}
    exact = torch.zeros(len(picked), len(rows), dtype=torch.bool)
    for i, s in enumerate(picked):
        exact[i, [at[r] for r in coherent.get(s, ()) if r in at]] = True
    dev = tb.a_all.device
    r_idx, s_idx = torch.tensor(rows, device=dev), torch.tensor(picked, device=dev)
    a3 = tb.a_all[:, :m * k].view(sets, m, k).index_select(0, s_idx).index_select(1, r_idx)
    b = tb.bnk_all[:, :n * k].view(sets, n, k) if shape.layout == "TN" else tb.bkn_all[:, :k * n].view(sets, k, n)
    c3 = tb.cc_all[:, :m * n].view(sets, m, n).index_select(0, s_idx).index_select(1, r_idx)
    verify_sets(a3, b.index_select(0, s_idx), c3, shape.layout, "timed calls verified", where,
                "is wrong on a replay of the timed graph (checked calls were right)", set_ids=picked, row_ids=rows,
                exact_rows=exact.to(dev))


#: Sampled timed replays of the candidate whose outputs are kept and verified after the loop
#: (a reservoir: uniformly random among all of them).
TIMED_SAMPLES = 2


class TimedSamples:
    """Outputs of timed replays of the candidate, drawn uniformly among all sampled ones
    (reservoir sampling), kept with the inputs they were computed from and verified after the
    loop (:meth:`check`): the exact and cancellation criteria apply to the timed calls
    themselves, not only to one more replay after them. :meth:`note` is the device timer's
    ``on_replay``: it runs before every sampled replay, before the perturbation, when C and the
    inputs still hold what the previous replay wrote and saw. Each kept replay: a random block
    of up to :data:`TIMED_CHECK_ROWS` rows of up to two random sets (one carrying the hidden
    cancellation where there is one), copied on the device without a synchronisation."""

    def __init__(self, tb: "TimingBuffers", shape: Shape, rng: random.Random, arm: str = "candidate",
                 keep: int = TIMED_SAMPLES) -> None:
        self.tb, self.shape, self.rng, self.arm, self.keep = tb, shape, rng, arm, keep
        self.seen, self.pending = 0, 0
        self.kept: list[tuple] = []

    def note(self, name: str) -> None:
        if self.pending:
            self.flush()
        if name == self.arm:
            self.seen += 1
            if len(self.kept) < self.keep or self.rng.random() < self.keep / self.seen:
                self.pending = self.seen

    def flush(self) -> None:
        """Keep the last replay's outputs if it was drawn (call once after the timed loop too).
        Only slices and device-side index tensors: a host-to-device copy would synchronise
        between timed replays."""
        if not self.pending:
            return
        tb, (m, n, k), sets = self.tb, (self.shape.m, self.shape.n, self.shape.k), self.tb.n_sets
        coherent = list(tb.coherent)
        picked = set(self.rng.sample(range(sets), min(sets, 2)))
        if coherent and not picked & set(coherent):
            picked = {self.rng.choice(coherent)} | set(sorted(picked)[:1])
        picked_l = sorted(picked)
        r0 = self.rng.randrange(max(1, m - TIMED_CHECK_ROWS + 1))  # a random block of rows
        r1 = min(m, r0 + TIMED_CHECK_ROWS)
        dev = tb.a_all.device
        b = tb.bnk_all[:, :n * k].view(sets, n, k) if self.shape.layout == "TN" else tb.bkn_all[:, :k * n].view(sets, k, n)
        a, c = tb.a_all[:, :m * k].view(sets, m, k), tb.cc_all[:, :m * n].view(sets, m, n)
        exact = torch.zeros(len(picked_l), m, dtype=torch.bool, device=dev)
        for i, s in enumerate(picked_l):
            if s in tb.coherent:
                # a device-side fill (isin would synchronise; so would `exact[i, rows] = True`,
                # whose scalar becomes a host tensor copied to the device)
                exact[i].index_fill_(0, tb.coherent[s], True)
        exact = exact[:, r0:r1]
        entry = (self.pending, picked_l, list(range(r0, r1)), torch.stack([a[s, r0:r1] for s in picked_l]),
                 torch.stack([b[s] for s in picked_l]), torch.stack([c[s, r0:r1] for s in picked_l]), exact)
        if len(self.kept) < self.keep:
            self.kept.append(entry)
        else:
            self.kept[self.rng.randrange(self.keep)] = entry
        self.pending = 0

    def check(self, where: str) -> None:
        """Verify every kept replay (stricter tolerance; the hidden test's rows exactly)."""
        for number, picked, rows, a3, b3, c3, exact in self.kept:
            verify_sets(a3, b3, c3, self.shape.layout, "timed calls verified", where,
                        f"is wrong on timed replay {number} of the candidate", set_ids=picked, row_ids=rows,
                        exact_rows=exact)


class InputsModified(CheckFailed):
    """A timed replay changed its own inputs (caught around the checked replay: the rotation is
    restored from its pristine copy afterwards, which would erase the change)."""


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

        # inputs drawn as the checked calls' are (uniform, scrambled): the recheck after timing runs on them
        self.a_all, self.a = stack(m, k, True)
        scramble_(self.a_all.uniform_(-1, 1, generator=gen), gen)
        self.bnk_all, self.b_nk = stack(n, k, True)
        scramble_(self.bnk_all.uniform_(-1, 1, generator=gen), gen)
        self.bkn_all, self.b_kn = stack(k, n, True)
        for i in range(n_sets):
            self.b_kn[i].copy_(self.b_nk[i].t())
        self.cc_all, self.cc = stack(m, n, False)
        self.cb_all, self.cb = stack(m, n, False)
        self.graphs: dict[str, Any] = {}
        self._inputs = [t.view(torch.int16) for t in (self.a_all[:, :m * k], self.bnk_all[:, :n * k],
                                                      self.bkn_all[:, :k * n])]
        self._pristine = [t.clone() for t in self._inputs]
        self._pristine_sums = _checksums(self._pristine)
        self._flipped: set[int] = set()
        self._dirty: set[int] = set()  # inputs (indices of _inputs) scrambled or embedded since the last unflip
        #: set -> rows of A that carry the hidden cancellation now (since the last scramble): their
        #: partial sums reach half of S, so they are judged by the exact tolerance alone
        self.coherent: dict[int, torch.Tensor] = {}
        self._mask: Optional[torch.Tensor] = None
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

    def _b_stored(self, layout: str) -> torch.Tensor:
        return self.bnk_all if layout == "TN" else self.bkn_all

    def live_inputs(self, layout: str) -> list[torch.Tensor]:
        """The inputs a candidate of ``layout`` is called on (int16 views: A, B as stored)."""
        return [self._inputs[0], self._inputs[1 if layout == "TN" else 2]]

    def _mask_window(self, numel: int, rng: random.Random, gen: torch.Generator) -> torch.Tensor:
        """``numel`` words of the rotation's scramble mask (:func:`scramble_mask`, made once: one
        set's row of the widest stack plus :data:`MASK_SLACK` words of room) from an offset drawn
        at random."""
        mask = self._mask
        if mask is None:
            widest = max(self.a_all.shape[1], self.bnk_all.shape[1], self.bkn_all.shape[1])
            mask = self._mask = scramble_mask(widest + MASK_SLACK, gen, self.a_all.device)
        off = rng.randrange(mask.numel() - numel + 1)
        return mask[off:off + numel]

    def scramble(self, gen: torch.Generator, rng: random.Random, layout: str,
                 sets: Optional[tuple[int, int]] = None) -> None:
        """The timers' input perturbation: XOR every fp16 of every set's A, or of every set's B
        (as stored for ``layout``), one of the two drawn at random, with a window of the scramble
        mask at a random offset (:func:`evaluators.correctness.scramble_`): sign, magnitude
        (within 4x, never above 2) and digits of every element of that operand change, so an
        output kept from an earlier call is stale everywhere and cannot be updated for less than
        a full product (a dense change of one operand suffices for that; both change over the
        replays). One elementwise kernel (4 bytes of memory traffic per element of the operand),
        outside the timed events; :meth:`unflip` restores the pristine copy. ``sets``: only the
        sets ``lo:hi`` (the host timers' single set)."""
        t = self.a_all if rng.random() < 0.5 else self._b_stored(layout)
        lo, hi = sets if sets is not None else (0, self.n_sets)
        scramble_(t[lo:hi], mask=self._mask_window(t.shape[1], rng, gen))  # one row of mask for every set
        self._dirty |= {0, 1 if layout == "TN" else 2}
        if sets is None:
            self.coherent = {}  # either operand scrambled: no hidden cancellation is left whole
        else:
            self.coherent = {s: r for s, r in self.coherent.items() if not lo <= s < hi}

    def _run_of_sets(self, rng: random.Random) -> tuple[int, int]:
        """A random run of sets (a view in place): one set, or up to an eighth of a big rotation."""
        count = rng.randint(1, max(1, self.n_sets // 8))
        lo = rng.randrange(self.n_sets - count + 1)
        return lo, lo + count

    def embed(self, gen: torch.Generator, rng: random.Random, shape: Shape,
              draws: Optional[CancellationDraws] = None) -> tuple[list[int], torch.Tensor]:
        """Hide the cancellation test (:func:`evaluators.correctness.embed_cancellation`) in a
        random run of sets, in place; (those sets, the rows of A that carry it, on the device:
        no synchronisation between timed replays). ``draws``: made before (instead of ``gen``'s)."""
        m, n, k = shape.m, shape.n, shape.k
        lo, hi = self._run_of_sets(rng)
        a3 = self.a_all[lo:hi, :m * k].view(hi - lo, m, k)
        b_kn = (self.bnk_all[lo:hi, :n * k].view(hi - lo, n, k).transpose(1, 2) if shape.layout == "TN"
                else self.bkn_all[lo:hi, :k * n].view(hi - lo, k, n))
        rows = embed_cancellation(a3, b_kn, gen, draws=draws)
        self._dirty |= {0, 1 if shape.layout == "TN" else 2}
        self.coherent.update({i: rows for i in range(lo, hi)})
        return list(range(lo, hi)), rows

    def poison_outputs(self, gen: torch.Generator, rng: random.Random, shape: Shape) -> None:
        """Poison the candidate's C of a random run of sets as a checked call's C is
        (:func:`evaluators.correctness.poison_`, NaN or finite)."""
        lo, hi = self._run_of_sets(rng)
        poison_(self.cc_all[lo:hi, :shape.m * shape.n], POISONS[rng.randrange(len(POISONS))], gen, shape.k)

    def unflip(self) -> None:
        """Undo every pending :meth:`flip`, :meth:`scramble` and :meth:`embed`: the inputs are
        bit-identical to the pristine copy again (sign flips undo themselves; the rest is copied back)."""
        for p in self._flipped:
            self.a_all[:, p].neg_()
        self._flipped.clear()
        for i in sorted(self._dirty):  # only what the perturbation touched: a stray change elsewhere stays visible
            self._inputs[i].copy_(self._pristine[i])
        self._dirty, self.coherent = set(), {}

    def intact(self) -> bool:
        """Bit-exact comparison of the inputs with their pristine copy (after :meth:`unflip`), and
        every stack's canaries: False when a candidate wrote into them, in place (its own A or B)
        or by a far store (the other cached rotations are the harness's other large live
        buffers, so they double as canaries). Every comparison is queued first and read in one
        synchronisation."""
        if self._flipped or self._dirty:
            return False
        changed = [(t != q).any() for t, q in zip(self._inputs, self._pristine)] + [g.guards_changed() for g in self._guards]
        changed += [(x != y).any() for x, y in zip(_checksums(self._pristine), self._pristine_sums)]
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


def _checksums(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Two sums per int16 tensor (of its values and of its bytes), without temporaries: the
    pristine copies are restored into the rotation after every timing, so a stray store into
    them must not pass unseen."""
    return torch.stack([s for t in tensors for s in (t.sum(dtype=torch.int64), t.view(torch.uint8).sum(dtype=torch.int64))])


#: Room in the scramble mask beyond one set's row: the number of different windows.
MASK_SLACK = 1 << 20


#: Most bytes a rotation's cached reference (:meth:`TimingBuffers.base_reference`) may take.
REFERENCE_CACHE_BYTES = 1 << 30
