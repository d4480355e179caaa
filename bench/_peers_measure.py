"""One shape on the GPU: check every contender on fresh inputs, then time them all together.

Contenders (arms, see ``_peers_stats.ARMS``): the evolved kernel, torch.matmul on both layouts
(``out=``, as the evaluator's baseline), cuBLASLt heuristic and autotuned (``_peers_cublaslt``),
Triton (``_peers_triton``), and, in the host timers only, ``torch.ops.evo.hgemm`` (the loader's
user-facing path, which allocates C).

Correctness: fresh uniform(-1, 1) inputs from an unseeded generator, C poisoned with NaN, one
call, compared elementwise with an fp32 reference (TF32 off) within the evaluator's K-aware
tolerance (``evaluators.correctness.tolerance_random``). The evolved kernel is timed only if it
passes; a peer that fails is dropped from timing with the reason in the row.

Timing: the evaluator's own timers (``evaluators.run._timers``) over the evaluator's rotation
buffers (``evaluators.run._rotation.TimingBuffers``: more than 2x L2 of input sets, so ``device``
is cold-L2) with the same perturbation (one sign flip of A per call, outside the timed window),
all arms interleaved in random order in one process: ``device`` (CUDA-graph replays), ``offline``
(sync, call, sync) and ``server`` (offline with exponential gaps at ``qps``).
"""
from __future__ import annotations

import os
import random
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from evaluators.correctness import tolerance_random
from evaluators.run._rotation import TimingBuffers
from evaluators.run._loader import is_poisoning
from evaluators.run._timers import Arm, DeviceTiming, device_timer, host_timer
from populations import Shape

from _peers_evolved import EvolvedKernel
from _peers_stats import decade

__all__ = ["Options", "Fatal", "check", "measure"]

#: ``bind(a, b_stored, c) -> call()``: a contender bound to one set of operands.
Binder = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], Callable[[], None]]


class Fatal(RuntimeError):
    """The CUDA context is gone (a sticky error): nothing more can run in this process."""


@dataclass
class Options:
    host_calls: int = 20
    qps: float = 2000.0
    device_budget_s: float = 0.05
    triton: Any = None        # the _peers_triton module, or None
    lt: Any = None            # an LtPeer, or None
    triton_calls: int = 5


def _stored_b(shape: Shape, gen: torch.Generator) -> torch.Tensor:
    rows, cols = (shape.n, shape.k) if shape.layout == "TN" else (shape.k, shape.n)
    return torch.empty(rows, cols, dtype=torch.float16, device="cuda").uniform_(-1, 1, generator=gen)


def _kn(shape: Shape, b_stored: torch.Tensor) -> torch.Tensor:
    return b_stored.t() if shape.layout == "TN" else b_stored


def check(shape: Shape, bind: Binder, gen: torch.Generator) -> tuple[bool, float, float, str]:
    """(passed, ||c - ref|| / ||ref||, max |c - ref| / tolerance, message) on fresh inputs;
    ``bind(a, b_stored, c)`` returns the call under test."""
    a = torch.empty(shape.m, shape.k, dtype=torch.float16, device="cuda").uniform_(-1, 1, generator=gen)
    b = _stored_b(shape, gen)
    c = torch.full((shape.m, shape.n), float("nan"), dtype=torch.float16, device="cuda")
    bind(a, b, c)()
    torch.cuda.synchronize()
    a32, b32 = a.float(), _kn(shape, b).float()
    ref = a32 @ b32
    tol = tolerance_random(ref, ((a32 * a32) @ (b32 * b32)).sqrt())
    del a32, b32
    got = c.float()
    nans = int(torch.isnan(got).sum())
    err = (got - ref).abs()
    rel = float(torch.linalg.vector_norm(torch.nan_to_num(got - ref)) / torch.linalg.vector_norm(ref).clamp(min=1e-30))
    ratio = float(torch.nan_to_num(err / tol, nan=float("inf")).max())
    if nans:
        return False, rel, ratio, f"{nans} outputs still NaN (not written)"
    if ratio > 1.0:
        bad = int((err > tol).sum())
        return False, rel, ratio, f"{bad} outputs outside tolerance (worst {ratio:.1f}x the tolerance)"
    return True, rel, ratio, "pass"


def _guard(what: str, notes: list[str], fn: Callable[[], Any]) -> Any:
    """Run ``fn``; a poisoning CUDA error raises :class:`Fatal`, any other is noted and gives None."""
    try:
        return fn()
    except Fatal:
        raise
    except Exception as exc:
        if is_poisoning(exc):
            raise Fatal(f"{what}: {exc}") from exc
        notes.append(f"{what}: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def measure(shape: Shape, kernel: Optional[EvolvedKernel], why_none: str, opts: Options, rng: random.Random,
            l2_bytes: int) -> dict[str, Any]:
    """One CSV row (see ``_peers_stats``): identity, the evolved kernel's check, every arm's medians."""
    notes: list[str] = []
    row: dict[str, Any] = {"shape": str(shape), "M": shape.m, "N": shape.n, "K": shape.k, "layout": shape.layout,
                           "flops": shape.flops, "decade": decade(shape.flops),
                           "evolved_path": kernel.path if kernel else why_none}
    gen = torch.Generator(device="cuda").manual_seed(int.from_bytes(os.urandom(6), "little"))
    ws = kernel.workspace_bytes if kernel else 0

    def w_for(n: int) -> Optional[torch.Tensor]:
        return torch.empty(n, max(ws, 1) + 255 >> 8 << 8, dtype=torch.uint8, device="cuda") if ws else None

    if kernel is not None:
        row.update(candidate=kernel.candidate, template=kernel.template,
                   archived_device_speedup="" if kernel.archived_speedup is None else round(kernel.archived_speedup, 4))
        w1 = w_for(1)
        res = _guard("evolved check", notes, lambda: check(shape, lambda a, b, c: kernel.bind(a, b, c, w1[0] if w1 is not None else None), gen))
        if res is None:
            row["evolved_check"] = "error: " + notes[-1]
        else:
            ok, rel, ratio, msg = res
            row.update(evolved_check="pass" if ok else f"fail: {msg}", evolved_rel_err=f"{rel:.3e}",
                       evolved_err_over_tol=f"{ratio:.3f}")
    tb = TimingBuffers(shape, ws, l2_bytes, torch.device("cuda"))
    n = tb.n_sets
    row["rotation_sets"] = n
    b_stored = tb.b_nk if shape.layout == "TN" else tb.b_kn
    b_kn = [_kn(shape, b) for b in b_stored]
    arms: list[Arm] = []
    host_only: list[Arm] = []
    if kernel is not None and row.get("evolved_check") == "pass":
        w_all = w_for(n)
        calls = [kernel.bind(tb.a[i], b_stored[i], tb.cc[i], w_all[i] if w_all is not None else None) for i in range(n)]
        arms.append(Arm("evolved", lambda i: calls[i](), n))
        if kernel.op:
            op = torch.ops.evo.hgemm
            host_only.append(Arm("evolved_op", lambda i: op(tb.a[i], b_kn[i]), n))
    arms.append(Arm("torch_nn", lambda i: torch.matmul(tb.a[i], tb.b_kn[i], out=tb.cb[i]), n))
    arms.append(Arm("torch_tn", lambda i: torch.matmul(tb.a[i], tb.b_nk[i].t(), out=tb.cb[i]), n))
    lt_plans: tuple = ()
    if opts.lt is not None and opts.lt.available:
        planned = _guard("cuBLASLt plan", notes, lambda: opts.lt.plans([(tb.a[i], b_kn[i], tb.cb[i])
                                                                         for i in range(min(n, 5))]))
        if planned is not None:
            heur, auto, row["lt_note"] = planned
            lt_plans = (heur, auto)
            row["lt_path"] = opts.lt.path(heur)
            for name, plan in (("lt_heuristic", heur), ("lt_autotuned", auto)):
                res = _guard(f"{name} check", notes, lambda p=plan: check(shape, lambda a, b, c: p.bind(a, _kn(shape, b), c), gen))
                if res is not None and res[0]:
                    bound = [plan.bind(tb.a[i], b_kn[i], tb.cb[i]) for i in range(n)]
                    arms.append(Arm(name, lambda i, bound=bound: bound[i](), n))
                elif res is not None:
                    notes.append(f"{name} failed the check: {res[3]}")
    elif opts.lt is not None:
        row["lt_note"] = opts.lt.reason
    if opts.triton is not None:
        tri = opts.triton
        tuned = _guard("triton tune", notes, lambda: tri.tune([(tb.a[i], b_kn[i], tb.cb[i]) for i in range(min(n, 5))],
                                                            calls=opts.triton_calls))
        if tuned is not None:
            cfg, _ = tuned
            row["triton_config"] = str(cfg)
            res = _guard("triton check", notes, lambda: check(shape, lambda a, b, c: tri.launcher(cfg, a, _kn(shape, b), c), gen))
            if res is not None and res[0]:
                bound_t = [tri.launcher(cfg, tb.a[i], b_kn[i], tb.cb[i]) for i in range(n)]
                arms.append(Arm("triton", lambda i: bound_t[i](), n))
            elif res is not None:
                row["triton_note"] = f"failed the check: {res[3]}"
    flip = {"p": rng.randrange(shape.m * shape.k)}

    # one element of every set's A changes sign between replays (a cheap stand-in: since issue 36
    # the evaluator scrambles every element of A or B, evaluators/run/_rotation.py)
    def perturb() -> None:
        flip["p"] = (flip["p"] + 7919) % (shape.m * shape.k)
        tb.flip(flip["p"])
    try:
        _fill(row, "device", _timed("device timer", arms, notes, lambda a: device_timer(
            a, settings=DeviceTiming(budget_s=opts.device_budget_s), rng=rng, perturb=perturb)))
        _fill(row, "offline", _timed("offline timer", arms + host_only, notes, lambda a: host_timer(
            a, calls=opts.host_calls, rng=rng, perturb=perturb)))
        _fill(row, "server", _timed("server timer", arms + host_only, notes, lambda a: host_timer(
            a, calls=opts.host_calls, qps=opts.qps, rng=rng, perturb=perturb)))
        torch.cuda.synchronize()
    finally:
        tb.unflip()
        if opts.lt is not None and lt_plans:
            opts.lt.free(*lt_plans)
    row["notes"] = "; ".join(notes)
    del tb, arms, host_only
    torch.cuda.empty_cache()
    return row


def _timed(label: str, arms: list[Arm], notes: list[str],
           timer: Callable[[list[Arm]], dict[str, Any]]) -> Optional[dict[str, Any]]:
    """All arms interleaved in one timer call; if that fails (not fatally), each other arm apart
    with the torch.matmul arms, so one contender's failure does not cost the others' numbers."""
    got = _guard(label, notes, lambda: timer(arms))
    base = [a for a in arms if a.name.startswith("torch")]
    if got is not None or len(arms) <= len(base) + 1:
        return got
    out: dict[str, Any] = {}
    for arm in arms:
        if arm not in base:
            part = _guard(f"{label}, {arm.name} with torch.matmul only", notes, lambda arm=arm: timer(base + [arm]))
            out.update(part or {})
    return out or None


def _fill(row: dict[str, Any], timer: str, stats: Optional[dict[str, Any]]) -> None:
    for name, st in (stats or {}).items():
        row[f"{timer}_{name}_us"] = round(st.median * 1e6, 4)
