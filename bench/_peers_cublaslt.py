"""The cuBLASLt peers through nvmath-python: the heuristic's first algorithm and the autotuned one.

nvmath's ``Matmul`` does the planning: operand layouts, the matmul descriptor (fp32 compute and
scale, ``CUBLAS_COMPUTE_32F``: torch.matmul's semantics) and ``plan()`` (cuBLASLt's heuristic,
up to ``limit`` algorithms, best first). "Heuristic" is the first of them. "Autotuned" is the
fastest of them in our own timing (events over a few calls on rotating operand sets, after one
warm-up call each), rather than ``Matmul.autotune()``, which flushes L2 by copying an L2-sized
host buffer to the GPU before every trial (about 0.3 s per shape with 8 algorithms). The calls we time
do not go through ``Matmul.execute()``: its Python path (stream holder, workspace context,
result allocation) costs tens of microseconds per call, which would make the host-inclusive
timers measure nvmath, not cuBLASLt. Instead each call is one ``cublasLt.matmul`` through
nvmath's Cython binding, with the plan's descriptors, a copy of the chosen algorithm struct, our
own workspace and the operands' pointers: the same host path as torch.matmul's own cuBLAS call.

That reuses attributes of ``Matmul`` that are not its documented API (``handle``, ``mm_desc``,
``*_layout_ptr``, ``alpha``/``beta``, ``algorithms_buffer``;
nvmath-python 1.0.0). Where they are missing the peer falls back to ``reset_operands_unchecked``
+ ``execute(algorithm=...)``, with nvmath's own autotuning, and says so (``lt_path``).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

__all__ = ["LtPeer", "LtPlan"]

RAW = ("handle", "mm_desc", "a_layout_ptr", "b_layout_ptr", "c_layout_ptr", "d_layout_ptr", "alpha", "beta",
       "algorithms_buffer")


class LtPlan:
    """One algorithm choice for one shape: ``bind(a, b_kn, c)`` gives a call computing c = a @ b_kn."""

    def __init__(self, peer: "LtPeer", mm: Any, algorithm: Any, struct: Any, workspace: torch.Tensor, raw: bool) -> None:
        self.peer, self.mm, self.algorithm, self.raw = peer, mm, algorithm, raw
        self.struct = struct            # our own copy of the cublasLtMatmulAlgo_t bytes (raw path)
        self.workspace = workspace      # one buffer: calls on one stream run in order

    def bind(self, a: torch.Tensor, b_kn: torch.Tensor, c: torch.Tensor) -> Callable[[], None]:
        mm = self.mm
        if self.raw:
            mat = self.peer.lt.matmul
            args_head = (mm.handle, mm.mm_desc, mm.alpha.ctypes.data, a.data_ptr(), mm.a_layout_ptr, b_kn.data_ptr(),
                         mm.b_layout_ptr, mm.beta.ctypes.data, c.data_ptr(), mm.c_layout_ptr, c.data_ptr(),
                         mm.d_layout_ptr, self.struct.ctypes.data, self.workspace.data_ptr(), self.workspace.numel())

            def call() -> None:
                mat(*args_head, torch.cuda.current_stream().cuda_stream)
            return call
        alg = self.algorithm

        def public() -> None:
            mm.reset_operands_unchecked(a=a, b=b_kn, c=c)
            mm.execute(algorithm=alg, stream=torch.cuda.current_stream())
        return public


class LtPeer:
    """``available`` and ``reason``; :meth:`plans` gives the heuristic and autotuned :class:`LtPlan`."""

    def __init__(self, autotune_iterations: int = 5, limit: int = 16) -> None:
        self.iterations, self.limit = max(1, autotune_iterations), limit
        self.reason: Optional[str] = None
        try:
            import numpy as np
            from nvmath.bindings import cublasLt
            from nvmath.linalg.advanced import Matmul, MatmulComputeType
        except Exception as exc:  # ImportError, or a library nvmath cannot load
            self.reason = f"nvmath-python is not importable ({type(exc).__name__}: {exc}); cuBLASLt columns missing"
            return
        self.np, self.lt, self.Matmul, self.compute = np, cublasLt, Matmul, MatmulComputeType.COMPUTE_32F

    @property
    def available(self) -> bool:
        return self.reason is None

    def plans(self, sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> tuple[LtPlan, LtPlan, str]:
        """(heuristic, autotuned, note) for the product on rotation sets ``(a, b_kn, c)`` (planned
        on the first; trials write into the sets' ``c``). The caller keeps both plans alive while
        it uses them and then calls :meth:`free`."""
        a, b_kn, c = sets[0]
        stream = torch.cuda.current_stream()
        mm = self.Matmul(a, b_kn, c=c, beta=0.0, stream=stream,
                         options={"compute_type": self.compute, "inplace": True})
        algorithms = list(mm.plan(preferences={"limit": self.limit}, stream=stream))
        if not all(hasattr(mm, name) for name in RAW):
            heur = LtPlan(self, mm, algorithms[0], None, torch.empty(1, dtype=torch.uint8, device="cuda"), False)
            mm.autotune(iterations=self.iterations, stream=stream)
            auto = LtPlan(self, mm, mm.algorithms[0], None, heur.workspace, False)
            return heur, auto, f"{len(algorithms)} algorithms planned; autotuned by nvmath"
        buf = mm.algorithms_buffer
        workspace = torch.empty(max(int(self.np.max(buf["workspace_size"])), 1), dtype=torch.uint8, device="cuda")
        plans = [LtPlan(self, mm, alg, self.np.array(buf[i]["algo"], copy=True), workspace, True)
                 for i, alg in enumerate(algorithms)]
        times = [self._trial(p, sets) for p in plans]
        best = min(range(len(plans)), key=lambda i: times[i])
        note = (f"{len(plans)} algorithms planned; fastest is heuristic #{best} "
                f"({times[best] * 1e6:.1f} us vs #0 {times[0] * 1e6:.1f} us)")
        return plans[0], plans[best], note

    def _trial(self, plan: LtPlan, sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> float:
        """Seconds per call: one warm-up, then ``iterations`` calls over the sets, timed with events."""
        calls = [plan.bind(*s) for s in sets]
        calls[0]()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(self.iterations):
            calls[i % len(calls)]()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / self.iterations

    @staticmethod
    def path(plan: LtPlan) -> str:
        return ("cublasLt.matmul (nvmath binding, pre-bound descriptors)" if plan.raw
                else "nvmath Matmul.execute (private attributes missing: host timers include nvmath's Python path)")

    @staticmethod
    def free(*plans: LtPlan) -> None:
        for p in plans:
            try:
                p.mm.free()
            except Exception:
                pass
