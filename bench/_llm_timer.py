"""The issue-26 benchmark's own timer (GPU): independent of ``evaluators._timers`` on purpose.

Per shape, in one process: operand sets rotated over more than 2x L2 (A M x K, W N x K as
nn.Linear stores it, W^T contiguous for the NN call, C), each contender captured in one CUDA
graph that calls it once on every set (repeated until a replay lasts about 0.3 ms), warm-up
replays, then ``rounds`` rounds that replay every contender once in a fresh random order,
each replay timed with events; a contender's time is the median over rounds / calls per replay.

Contenders: ``cublas_tn`` ``torch.matmul(a, w.t(), out=c)``, ``cublas_nn``
``torch.matmul(a, wt, out=c)`` (the better of the two is "cuBLAS"), ``evo`` the exported library's
``evo_hgemm(a, w.t())`` (its kernel or its own cuBLAS fallback, whatever it dispatches to), and
on decode rows the plain peer, best of its launch configurations (screened with 3 rounds each).
Correctness of evo and the peer on the first set against an fp32 reference (relative
Frobenius error).
"""
from __future__ import annotations

import math
import random
import statistics
from typing import Any, Callable, Optional

import torch

__all__ = ["Sets", "time_arms", "rel_error", "PeerRunner", "REL_TOL"]

REL_TOL = 5e-3  # relative Frobenius error accepted (fp16 output of an fp32-accumulated product is ~3e-4)
MAX_SETS = 512
TARGET_REPLAY_S = 3e-4

Launch = Callable[[int], None]


class Sets:
    """Rotating operand sets of one shape (more than ``2 * l2`` bytes when at most MAX_SETS do)."""

    def __init__(self, m: int, n: int, k: int, l2: int, seed: int = 0) -> None:
        per = 2 * (m * k + n * k + m * n)  # what one call touches (the NN arm's W^T copy replaces W)
        self.n_sets = max(2, min(MAX_SETS, math.ceil(2 * l2 / per) + 1))
        self.bytes = per * self.n_sets  # bytes one contender rotates over
        gen = torch.Generator(device="cuda").manual_seed(seed)
        self.a = [torch.randn(m, k, device="cuda", dtype=torch.float16, generator=gen) for _ in range(self.n_sets)]
        self.w = [torch.randn(n, k, device="cuda", dtype=torch.float16, generator=gen) / math.sqrt(k)
                  for _ in range(self.n_sets)]
        self.wt = [w.t().contiguous() for w in self.w]
        self.c = [torch.empty(m, n, device="cuda", dtype=torch.float16) for _ in range(self.n_sets)]

    def reference(self) -> torch.Tensor:
        return self.a[0].float() @ self.w[0].float().t()


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| (inf where got has NaN or infinities)."""
    g = got.float()
    if not bool(torch.isfinite(g).all()):
        return math.inf
    return float(torch.linalg.vector_norm(g - ref) / torch.linalg.vector_norm(ref).clamp(min=1e-30))


def _capture(launch: Launch, n_sets: int, repeat: int, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    with torch.cuda.stream(stream):
        launch(0)  # warm: lazy init, cuBLAS handles and workspaces outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        for _ in range(repeat):
            for i in range(n_sets):
                launch(i)
    g.replay()
    torch.cuda.synchronize()
    return g


def time_arms(arms: dict[str, Launch], n_sets: int, *, rounds: int = 7, warmup: int = 2,
              rng: Optional[random.Random] = None) -> dict[str, float]:
    """Median seconds per call of every arm (see the module docstring)."""
    rng = rng or random.Random(0)
    stream = torch.cuda.Stream()
    graphs: dict[str, tuple[torch.cuda.CUDAGraph, int]] = {}
    for name, launch in arms.items():
        probe = _capture(launch, n_sets, 1, stream)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        probe.replay()
        e1.record()
        e1.synchronize()
        one = max(e0.elapsed_time(e1) * 1e-3, 1e-7)
        repeat = max(1, min(64, math.ceil(TARGET_REPLAY_S / one)))
        graphs[name] = (probe, 1) if repeat == 1 else (_capture(launch, n_sets, repeat, stream), repeat)
        if repeat > 1:
            del probe
    for _ in range(warmup):
        for g, _r in graphs.values():
            g.replay()
    samples: dict[str, list[float]] = {name: [] for name in graphs}
    names = list(graphs)
    for _ in range(rounds):
        rng.shuffle(names)
        for name in names:
            g, repeat = graphs[name]
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            g.replay()
            e1.record()
            e1.synchronize()
            samples[name].append(e0.elapsed_time(e1) * 1e-3 / (repeat * n_sets))
    del graphs
    return {name: statistics.median(xs) for name, xs in samples.items()}


class PeerRunner:
    """The plain peer (``--peer PATH``, imported at run time): its kernels for the decode M values,
    and per shape the best of its launch configurations that pass the check."""

    def __init__(self, module: Any, ms: list[int]) -> None:
        self.mod = module
        self.fns = module.build(sorted(set(ms)))

    def configs(self, m: int) -> list[tuple[str, int, int, int]]:
        mod = self.mod
        return ([("gemv", m, r, w) for r, w in mod.CONFIGS]
                + [("mma", (m + 7) // 8, r, w) for r, w in mod.MMA_CONFIGS])

    def best(self, sets: Sets, ref: torch.Tensor, m: int, rng: random.Random) -> tuple[Optional[Launch], str, dict]:
        """(launch of the fastest passing config, its name, {config: screened seconds})."""
        screened: dict[str, float] = {}
        launches: dict[str, Launch] = {}
        for kind, mm, r, w in self.configs(m):
            fn = self.fns.get((kind, mm, r, w))
            if fn is None:
                continue
            raw = self.mod.ours(kind, fn, r, w)
            launch = (lambda raw: lambda i: raw(sets.a[i], sets.w[i], sets.c[i]))(raw)
            name = f"{kind}<{mm},{r},{w}>"
            try:
                launch(0)
                torch.cuda.synchronize()
                if not rel_error(sets.c[0], ref) < REL_TOL:
                    continue
                screened[name] = time_arms({name: launch}, sets.n_sets, rounds=3, warmup=1, rng=rng)[name]
                launches[name] = launch
            except Exception as exc:  # a config that cannot launch here is skipped, not fatal
                screened[name] = math.nan
                if "illegal" in str(exc).lower():
                    raise
        if not launches:
            return None, "", screened
        name = min(launches, key=lambda k: screened[k])
        return launches[name], name, screened
