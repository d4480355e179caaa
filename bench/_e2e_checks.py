"""Checks of bench/model_e2e_bench.py's legs that explain a figure rather than measure speed (issue 19).

- :func:`first_divergence`: where two greedy runs of one prompt part (step, batch row), the
  top-2 logit margins there, and how far their logits were apart while their inputs were still
  the same. It tells a near-tie flipped by a different (valid) fp32 summation order (small
  margin, logit differences of rounding size) from a bug (large differences from step 0 on).
- :func:`gemm_order`: every ``nn.Linear`` of an unpatched model through another valid GEMM, so
  cuBLAS itself can be compared with cuBLAS under a different summation order: the yardstick for
  "token-identical" (``nn``: ``x @ W^T`` with W^T materialised, cuBLAS's NN layout and its own
  kernels; ``fp32``: inputs and weight upcast, the result cast back).
- :func:`linear_call_us`: host-inclusive time of one ``nn.Linear`` call, plain and patched
  (a call whose token count the library covers, and one it does not).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Optional

#: the alternative GEMM orders of :func:`gemm_order`
ORDERS = ("nn", "fp32")


def first_divergence(tok_a: Any, logits_a: Any, tok_b: Any, logits_b: Any) -> dict[str, Any]:
    """Compare greedy run A with run B: ``tok_*`` (batch, steps) token ids, ``logits_*`` (steps,
    batch, vocab), step i's logits being the ones token i was chosen from. Returns
    ``first_step`` (None when the tokens agree), ``max_rel_diff`` (the largest |logit_A - logit_B|
    over the steps whose inputs agree, i.e. up to and including the first diverging one, relative
    to A's largest |logit|), ``step0_rel_diff`` (the same at step 0, the prefill's last token);
    at a divergence also its batch ``rows``, for the first of them ``row``, the two ``tokens``
    (A's, B's), A's and B's top-2 margins ``margin_a`` / ``margin_b`` (absolute and ``*_rel``)
    and ``row_max_abs_diff``, the largest logit difference in that row at that step."""
    differ = tok_a.ne(tok_b)
    steps = differ.any(0).nonzero().flatten().tolist()
    first: Optional[int] = steps[0] if steps else None
    upto = tok_a.shape[1] if first is None else first + 1
    la, lb = logits_a[:upto].float(), logits_b[:upto].float()
    scale = float(la.abs().max().clamp_min(1e-6))
    diff = (la - lb).abs()
    out: dict[str, Any] = {"first_step": first, "steps": int(tok_a.shape[1]), "max_logit": scale,
                           "max_abs_diff": float(diff.max()), "max_rel_diff": float(diff.max()) / scale,
                           "step0_rel_diff": float(diff[0].max()) / scale}
    if first is None:
        return out
    rows = differ[:, first].nonzero().flatten().tolist()
    r = rows[0]
    top_a, top_b = la[first, r].topk(2).values, lb[first, r].topk(2).values
    margin_a, margin_b = float(top_a[0] - top_a[1]), float(top_b[0] - top_b[1])
    out.update(rows=rows, row=r, tokens=[int(tok_a[r, first]), int(tok_b[r, first])], margin_a=margin_a,
               margin_b=margin_b, margin_a_rel=margin_a / scale, margin_b_rel=margin_b / scale,
               row_max_abs_diff=float(diff[first, r].max()))
    return out


def _nn_forward(weight_t: Any, bias: Any, x: Any) -> Any:
    import torch

    y = torch.matmul(x, weight_t)
    return y if bias is None else y + bias


def _fp32_forward(weight: Any, bias: Any, x: Any) -> Any:
    import torch

    b = None if bias is None else bias.float()
    return torch.nn.functional.linear(x.float(), weight.float(), b).to(x.dtype)


@contextlib.contextmanager
def gemm_order(model: Any, how: str) -> Iterator[int]:
    """Inside, every ``nn.Linear`` of ``model`` (unpatched: its forward must be the class's)
    computes through the GEMM order ``how`` (one of :data:`ORDERS`); yields how many modules.
    ``nn`` holds a transposed copy of each weight while inside (twice the weights' memory)."""
    import functools

    import torch

    if how not in ORDERS:
        raise ValueError(f"unknown GEMM order {how!r}: one of {', '.join(ORDERS)}")
    mods = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if any("forward" in vars(m) for m in mods):
        raise ValueError("gemm_order needs an unpatched model (a forward is already replaced)")
    for m in mods:
        if how == "nn":
            m.forward = functools.partial(_nn_forward, m.weight.detach().t().contiguous(), m.bias)
        else:
            m.forward = functools.partial(_fp32_forward, m.weight, m.bias)
    try:
        yield len(mods)
    finally:
        for m in mods:
            del m.forward


def linear_call_us(library: Any, device: str, calls: int = 500, rounds: int = 15) -> dict[str, Any]:
    """Microseconds per ``nn.Linear`` call on the smallest (N, K) ``library`` covers, host time
    while the device keeps up (synchronised at the ends of a loop of ``calls`` only): unpatched
    ``plain_us`` at the smallest token count the library lacks and ``plain_covered_m_us`` at the
    smallest it has; patched, ``uncovered_us`` (Python's check, then ``F.linear``) and
    ``covered_us`` (the native operator); and the differences (``*_overhead_us``). Each figure is
    the best of ``rounds`` loops, plain and patched loops interleaved (the patch is reversible),
    so a busy machine inflates neither side alone; on the CPU with one thread."""
    import torch

    from evo.torch import patch, unpatch
    from evo.torch._patch import coverage

    cover = coverage(library)
    if not cover:
        return {"error": "the library covers no TN shape"}
    (n, k), ms = min(cover.items(), key=lambda kv: kv[0][0] * kv[0][1])
    m_unc = next(m for m in range(1, max(ms) + 2) if m not in ms)
    lin = torch.nn.Linear(k, n, dtype=torch.float16, device=device)
    gen = torch.Generator().manual_seed(3)
    xs = {"covered": torch.randn(ms[0], k, generator=gen).half().to(device),
          "uncovered": torch.randn(m_unc, k, generator=gen).half().to(device)}

    def per_call(x: Any) -> float:
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            lin(x)
        if device == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / calls * 1e6

    best = {f"{side}_{what}": float("inf") for side in ("plain", "patched") for what in xs}
    threads = torch.get_num_threads()
    if device == "cpu":  # one thread: a CPU GEMM's thread pool on a shared machine drowns microseconds
        torch.set_num_threads(1)
    with torch.no_grad(), contextlib.ExitStack() as stack:
        stack.callback(torch.set_num_threads, threads)
        for _ in range(rounds):
            for side in ("plain", "patched"):
                if side == "patched":
                    patch(lin, library)
                try:
                    for what, x in xs.items():
                        lin(x)
                        best[f"{side}_{what}"] = min(best[f"{side}_{what}"], per_call(x))
                finally:
                    unpatch(lin)
    return {"n": n, "k": k, "m_covered": ms[0], "m_uncovered": m_unc, "calls": calls, "rounds": rounds,
            "plain_us": best["plain_uncovered"], "uncovered_us": best["patched_uncovered"],
            "plain_covered_m_us": best["plain_covered"], "covered_us": best["patched_covered"],
            "uncovered_overhead_us": best["patched_uncovered"] - best["plain_uncovered"],
            "covered_overhead_us": best["patched_covered"] - best["plain_covered"]}
