"""A random-interleaving model of streamk90's synchronisation protocol (kernel.cu's logic, not its
text): per CTA one producer and CONSUMERS consumer warpgroups, full/empty mbarriers with phase
parity, named barrier 1 and the fix-up flags, over the shared scheduler's unit walk. It checks that
every ring slot a consumer reads holds the (tile, K block) it expects across consecutive units with
different K ranges (the running-count parity), that no interleaving deadlocks while all CTAs are
resident, that every tile's K blocks are summed exactly once and that every flag ends cleared.
It does not read the CUDA source: keep it in step with kernel.cu by hand. Mutations it catches:
restarting the ring count per unit, a missing last-stage release, an owner that skips a wait.
"""
from __future__ import annotations

import random

import pytest

from test_template_streamk import begin, split

READY = 0x9E3779B9


def walk(g: int, tiles: int, iters: int, ctas: int, dp: int):
    """StreamkWalk::next: stream-K segments, then data-parallel tiles."""
    dp_tiles, sk = split(tiles, ctas, dp)
    total = sk * iters
    it, end = begin(g, total, ctas), begin(g + 1, total, ctas)
    while it < end:
        s = it // iters
        t0 = s * iters
        k0, k1 = it - t0, min(end - t0, iters)
        yield dp_tiles + s, k0, k1
        it = t0 + k1
    yield from ((t, 0, iters) for t in range(g, dp_tiles, ctas))


def next_peer(p: int, tile: int, tiles: int, iters: int, ctas: int, dp: int) -> int:
    dp_tiles, sk = split(tiles, ctas, dp)
    total = sk * iters
    tile_end = (tile - dp_tiles + 1) * iters
    p += 1
    while p < ctas and begin(p, total, ctas) < tile_end:
        if begin(p, total, ctas) != begin(p + 1, total, ctas):
            return p
        p += 1
    return -1


class MBar:
    """An mbarrier: `count` arrivals complete a phase; try_wait.parity(P) succeeds once phase P has
    completed, i.e. while the current phase's parity differs from P (a fresh barrier passes P = 1)."""

    def __init__(self, count: int) -> None:
        self.count = self.pending = count
        self.phase = 0

    def arrive(self) -> None:
        self.pending -= 1
        if self.pending == 0:
            self.phase ^= 1
            self.pending = self.count

    def passed(self, parity: int) -> bool:
        return self.phase != parity


def run(tiles: int, iters: int, ctas: int, dp: int, stages: int, cons: int, seed: int) -> None:
    rng = random.Random(seed)
    flags = [0xFFFFFFFF] * ctas  # a hostile workspace fill
    slots: list = [None] * ctas
    written: dict[tuple[int, int], int] = {}
    procs = []
    for g in range(ctas):
        full = [MBar(1) for _ in range(stages)]
        empty = [MBar(cons) for _ in range(stages)]
        ring: list = [None] * stages
        nbar = {"count": 0, "gen": 0}

        def producer(g=g, full=full, empty=empty, ring=ring):
            stage, phase = 0, 0
            for t, k0, k1 in walk(g, tiles, iters, ctas, dp):
                for kb in range(k0, k1):
                    while not empty[stage].passed(phase ^ 1):
                        yield
                    ring[stage] = (t, kb)  # expect_tx + the TMA boxes, completing as one step
                    full[stage].arrive()
                    stage += 1
                    if stage == stages:
                        stage, phase = 0, phase ^ 1

        def consumers_sync(nbar=nbar):
            gen = nbar["gen"]
            nbar["count"] += 1
            if nbar["count"] == cons:
                nbar["count"] = 0
                nbar["gen"] += 1
            while nbar["gen"] == gen:
                yield

        def consumer(c, g=g, full=full, empty=empty, ring=ring, sync=consumers_sync):
            it = 0
            for t, k0, k1 in walk(g, tiles, iters, ctas, dp):
                acc, prev = [], -1
                for kb in range(k0, k1):
                    stage = it % stages
                    while not full[stage].passed((it // stages) & 1):
                        yield
                    assert ring[stage] == (t, kb), (g, c, ring[stage], (t, kb))
                    acc.append(kb)
                    yield  # the wgmmas in flight
                    if prev >= 0:
                        empty[prev].arrive()  # wait_group 1: the previous block has retired
                    prev = stage
                    it += 1
                empty[prev].arrive()  # wait_group 0
                if k0 > 0:  # a peer: slot, barrier, flag
                    if c == 0:
                        slots[g] = (t, tuple(acc))
                    yield from sync()
                    if c == 0:
                        flags[g] = READY
                    continue
                if k1 < iters:  # the owner of a split tile
                    p = next_peer(g, t, tiles, iters, ctas, dp)
                    while p >= 0:
                        if c == 0:
                            while flags[p] != READY:
                                yield
                        yield from sync()
                        assert slots[p] is not None and slots[p][0] == t, (g, c, p, t)
                        acc += slots[p][1]
                        if c == 0:
                            flags[p] = 0
                        p = next_peer(p, t, tiles, iters, ctas, dp)
                assert sorted(acc) == list(range(iters)), (t, acc)
                written[(t, c)] = written.get((t, c), 0) + 1

        procs += [producer()] + [consumer(c) for c in range(cons)]
    live, steps = list(procs), 0
    cap = 100000 + 200 * len(procs) * (tiles * iters + ctas)  # spinning waiters yield forever
    while live:
        p = rng.choice(live)
        try:
            next(p)
        except StopIteration:
            live.remove(p)
        steps += 1
        if steps > cap:
            raise RuntimeError(f"no progress after {steps} steps: deadlock")
    assert sorted(written) == [(t, c) for t in range(tiles) for c in range(cons)]
    assert all(v == 1 for v in written.values())
    assert READY not in flags


CASES = [(5, 7, 4), (3, 16, 11), (9, 3, 6), (1, 20, 13), (12, 5, 5), (7, 1, 3), (2, 9, 18), (20, 4, 6),
         (133, 3, 132)]


@pytest.mark.parametrize("dp", (0, 1, 2))
@pytest.mark.parametrize("cons", (1, 2))
def test_protocol_model_has_no_parity_alias_or_deadlock(dp: int, cons: int) -> None:
    for tiles, iters, ctas in CASES:
        for stages in (2, 3, 5):
            for seed in range(2):
                run(tiles, iters, ctas, dp, stages, cons, seed)
