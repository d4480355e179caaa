"""The cuBLASLt peers through nvmath-python: the heuristic's first algorithm and the autotuned one.

nvmath's ``Matmul`` does the planning: operand layouts, the matmul descriptor (fp32 compute and
scale, ``CUBLAS_COMPUTE_32F``: torch.matmul's semantics), ``plan()`` (cuBLASLt's heuristic,
best first) and ``autotune()`` (every planned algorithm timed, fastest first). The calls we time
do not go through ``Matmul.execute()``: its Python path (stream holder, workspace context,
result allocation) costs tens of microseconds per call, which would make the host-inclusive
timers measure nvmath, not cuBLASLt. Instead each call is one ``cublasLt.matmul`` through
nvmath's Cython binding, with the plan's descriptors, a copy of the chosen algorithm struct, our
own workspace and the operands' pointers: the same host path as torch.matmul's own cuBLAS call.

That reuses attributes of ``Matmul`` that are not its documented API (``handle``, ``mm_desc``,
``*_layout_ptr``, ``alpha``/``beta``, ``cached_best_algorithm_struct``, ``algorithms_buffer``;
nvmath-python 1.0.0). Where they are missing the peer falls back to ``reset_operands_unchecked``
+ ``execute(algorithm=...)`` and says so (``lt_path``).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

__all__ = ["LtPeer", "LtPlan"]

RAW = ("handle", "mm_desc", "a_layout_ptr", "b_layout_ptr", "c_layout_ptr", "d_layout_ptr", "alpha", "beta",
       "cached_best_algorithm_struct", "algorithms_buffer")


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

    def __init__(self, autotune_iterations: int = 3) -> None:
        self.iterations = autotune_iterations
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

    def plans(self, a: torch.Tensor, b_kn: torch.Tensor, c: torch.Tensor) -> tuple[LtPlan, LtPlan, str]:
        """(heuristic, autotuned, note) for the product on these operands (set 0 of the rotation;
        autotuning writes into ``c``). The caller keeps both plans alive while it uses them and
        then calls :meth:`free`."""
        stream = torch.cuda.current_stream()
        mm = self.Matmul(a, b_kn, c=c, beta=0.0, stream=stream,
                         options={"compute_type": self.compute, "inplace": True})
        algorithms = mm.plan(stream=stream)
        raw = all(hasattr(mm, name) for name in RAW)
        heur = self._plan(mm, algorithms[0], raw)
        mm.autotune(iterations=self.iterations, stream=stream)
        best = mm.algorithms[0]
        auto = self._plan(mm, best, raw)
        note = (f"{len(algorithms)} algorithms planned; autotuned pick is heuristic #{list(algorithms).index(best)}"
                if best in algorithms else f"{len(algorithms)} algorithms planned")
        return heur, auto, note

    def _plan(self, mm: Any, algorithm: Any, raw: bool) -> LtPlan:
        """Called right after plan() or autotune(): the cached best struct is then ``algorithm``'s."""
        ws_bytes, struct = 0, None
        if raw:
            struct = self.np.array(mm.cached_best_algorithm_struct, copy=True)
            ws_bytes = int(self.np.max(mm.algorithms_buffer["workspace_size"]))
        workspace = torch.empty(max(ws_bytes, 1), dtype=torch.uint8, device="cuda")
        return LtPlan(self, mm, algorithm, struct, workspace, raw)

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
