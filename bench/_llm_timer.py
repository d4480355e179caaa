"""The issue-26 benchmark's timer (GPU): the library's (``evo.export._export_timer``), plus the plain peer.

The timer itself (CUDA-graph replay, interleaved rounds, medians) is the evaluators' one
(``evaluators.timers.replay_medians``); the rotating operand sets > 2x L2 live in
``evo/export/_export_timer.py`` because ``evo export --verify`` re-times candidates with them
before it decides which path a shape takes; the benchmark then measures the library with the
same timer that chose it, and the figures compare.

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
from typing import Any, Callable, Optional

import torch

from evo.export._export_timer import REL_TOL, Sets, rel_error, time_arms

__all__ = ["Sets", "time_arms", "rel_error", "PeerRunner", "REL_TOL"]

Launch = Callable[[int], None]


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

    @staticmethod
    def name(kind: str, mm: int, r: int, w: int) -> str:
        return f"{kind}<{mm},{r},{w}>"

    def names(self, m: int) -> list[str]:
        """The names of the configurations built for ``m`` (what :meth:`best` tries)."""
        return [self.name(*c) for c in self.configs(m) if c in self.fns]

    def launch_of(self, name: str) -> Callable[[Any, Any, Any], None]:
        """launch(a, w, c) of the configuration ``name`` (for bench/_peer_screen.py's child)."""
        for key in self.fns:
            if self.name(*key) == name:
                return self.mod.ours(key[0], self.fns[key], key[2], key[3])
        raise KeyError(name)

    def best(self, sets: Sets, ref: torch.Tensor, m: int, rng: random.Random,
             skip: frozenset = frozenset()) -> tuple[Optional[Launch], str, dict]:
        """(launch of the fastest passing config, its name, {config: screened seconds}); ``skip``:
        names not to launch (those bench/_peer_screen.py found hanging at this shape)."""
        screened: dict[str, float] = {}
        launches: dict[str, Launch] = {}
        for kind, mm, r, w in self.configs(m):
            fn = self.fns.get((kind, mm, r, w))
            name = self.name(kind, mm, r, w)
            if fn is None or name in skip:
                if name in skip:
                    screened[name] = math.nan
                continue
            raw = self.mod.ours(kind, fn, r, w)
            launch = (lambda raw: lambda i: raw(sets.a[i], sets.w[i], sets.c[i]))(raw)
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
