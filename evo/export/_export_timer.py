"""Timing exported launchers and cuBLAS, and the re-timing child of ``evo export --verify``.

Per shape, in one process, operand sets rotated over more than 2x L2 (:class:`Sets`: A M x K,
W N x K as nn.Linear stores it, W^T contiguous for the NN calls, C), timed by the evaluators'
timer (:func:`time_arms` is ``evaluators.timers.replay_medians``: each contender captured in one
CUDA graph that calls it once on every set, repeated until a replay lasts about 0.3 ms; warm-up
replays; then ``rounds`` rounds that replay every contender once in a fresh random order, each
replay timed with events; a contender's time is the median over rounds / calls per replay).
:func:`rel_error` checks outputs against an fp32 reference.

The child (``python -m evo.export._export_timer LIB PLAN OUT``; :func:`retime`) loads a trial library,
and for every shape of the plan times cuBLAS in both layouts (``a @ w.t()`` and ``a @ wt``) and
each candidate's launcher (``fn(A, B, C, M, N, K, workspace, stream)``, B as the shape's layout
stores it) after checking its output on the first set against an fp32 reference. It appends one
JSON line per event to OUT: ``{"trying": SHAPE, "symbol": S}`` before a candidate's first call
and ``{"timing": SHAPE}`` before the timed replays (so that the parent knows what killed it, if
something does), then ``{"shape": SHAPE, ...}`` with the times. It initialises CUDA; ``evo
export`` runs it in a child process so that a kernel that poisons the context cannot take the
export with it.
"""
from __future__ import annotations

import ctypes
import json
import math
import random
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from evaluators.timers import replay_medians as time_arms
from evaluators.timers import rotation_sets

__all__ = ["Sets", "time_arms", "rel_error", "retime", "main", "REL_TOL", "ROUNDS"]

REL_TOL = 5e-3  # relative Frobenius error accepted (fp16 output of an fp32-accumulated product is ~3e-4)
MAX_SETS = 512
ROUNDS = 7

Launch = Callable[[int], None]


class Sets:
    """Rotating operand sets of one shape (more than ``2 * l2`` bytes when at most MAX_SETS do)."""

    def __init__(self, m: int, n: int, k: int, l2: int, seed: int = 0) -> None:
        per = 2 * (m * k + n * k + m * n)  # what one call touches (the NN arm's W^T copy replaces W)
        self.n_sets = rotation_sets(per, l2, maximum=MAX_SETS)
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


# -- the re-timing child ----------------------------------------------------------------------
def _launcher(lib: ctypes.CDLL, symbol: str) -> Any:
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3 + [ctypes.c_void_p] * 2
    return fn


def _shape(lib: ctypes.CDLL, item: dict[str, Any], l2: int, rounds: int, rng: random.Random,
           note: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Time one plan item (cuBLAS both layouts, every candidate that passes its check)."""
    m, n, k, nn = item["m"], item["n"], item["k"], item["layout"] == "NN"
    sets = Sets(m, n, k, l2, seed=rng.randrange(1 << 30))
    ref = sets.reference()
    arms: dict[str, Launch] = {"cublas_tn": lambda i: torch.matmul(sets.a[i], sets.w[i].t(), out=sets.c[i]),
                               "cublas_nn": lambda i: torch.matmul(sets.a[i], sets.wt[i], out=sets.c[i])}
    checks: dict[str, dict[str, Any]] = {}
    stream = lambda: torch.cuda.current_stream().cuda_stream  # noqa: E731 (the capture's stream when capturing)
    for cand in item["candidates"]:
        sym = cand["symbol"]
        note({"trying": item["shape"], "symbol": sym})
        fn = _launcher(lib, sym)
        ws = torch.empty(max(1, cand["workspace"]), dtype=torch.uint8, device="cuda")
        b = sets.wt if nn else sets.w
        call = (lambda fn, ws, b: lambda i: fn(sets.a[i].data_ptr(), b[i].data_ptr(), sets.c[i].data_ptr(),
                                                m, n, k, ws.data_ptr(), stream()))(fn, ws, b)
        sets.c[0].fill_(float("nan"))
        rc = call(0)
        torch.cuda.synchronize()
        err = rel_error(sets.c[0], ref) if rc == 0 else math.inf
        checks[sym] = {"rc": rc, "rel_err": err}
        if rc == 0 and err < REL_TOL:
            arms[sym] = call
    note({"timing": item["shape"]})
    times = time_arms(arms, sets.n_sets, rounds=rounds, rng=rng)
    out = {"shape": item["shape"], "cublas_tn_s": times.pop("cublas_tn"), "cublas_nn_s": times.pop("cublas_nn"),
           "sets": sets.n_sets, "rotation_bytes": sets.bytes, "rounds": rounds,
           "candidates": {sym: {**c, "s": times.get(sym)} for sym, c in checks.items()}}
    del sets, ref
    torch.cuda.empty_cache()
    return out


def retime(lib_path: Path, plan: list[dict[str, Any]], out: Path, *, rounds: int = ROUNDS, seed: int = 0) -> None:
    """Time every shape of ``plan`` with the launchers of ``lib_path``, appending JSON lines to ``out``."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.zeros(1, device="cuda")  # the primary context, current before the library's runtime looks
    lib = ctypes.CDLL(str(lib_path))
    l2 = int(torch.cuda.get_device_properties(0).L2_cache_size)
    rng = random.Random(seed)
    with open(out, "a") as f:
        def note(rec: dict[str, Any]) -> None:
            f.write(json.dumps(rec, allow_nan=True) + "\n")
            f.flush()
        for item in plan:
            note(_shape(lib, item, l2, rounds, rng, note))


def main(argv: Optional[list[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (3, 4):
        print("usage: python -m evo.export._export_timer LIB PLAN.json OUT.jsonl [ROUNDS]", file=sys.stderr)
        return 2
    plan = json.loads(Path(args[1]).read_text())
    retime(Path(args[0]), plan, Path(args[2]), rounds=int(args[3]) if len(args) == 4 else ROUNDS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
