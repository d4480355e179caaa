"""``evo eval`` without a GPU: what a kernel author can learn on any machine with the CUDA toolkit.

The static scan (what evo rejects before compiling), the compile (nvcc or NVRTC, as a run does),
ptxas' figures per kernel (registers, spills, static shared memory, stack) and, per shape, the
launch plan resolved into grids, blocks, dynamic shared memory and workspace. No timing and no
correctness: those need the GPU. ``evo eval --compile-only`` asks for this even where a GPU is
visible; where none is, ``evo eval`` prints it before saying it cannot time the kernel.
"""
from __future__ import annotations

from typing import Any

from populations import Candidate, PlanError

__all__ = ["static_report", "render_static"]


def _compile_arch(arch: str) -> str:
    """The compile target for ``--arch``: Hopper's sm_90a, else the sm_80 code every Ampere/Ada runs."""
    return "sm_90a" if arch.startswith("sm_90") else "sm_80"


def static_report(cand: Candidate, arch: str) -> dict[str, Any]:
    """Scan, compile and resolve ``cand`` for ``arch`` (no GPU needed); never raises for bad code."""
    from evaluators import compile_candidate

    target = _compile_arch(arch)
    res = compile_candidate(cand, target)
    shapes = []
    for shape in cand.shapes:
        try:
            launches, workspace = cand.plan.resolve(shape)
            shapes.append({"shape": str(shape), "workspace_bytes": workspace,
                           "launches": [{"kernel": r.kernel, "grid": list(r.grid), "block": list(r.block),
                                         "smem_bytes": r.smem} for r in launches]})
        except PlanError as exc:
            shapes.append({"shape": str(shape), "error": str(exc)})
    return {"arch": target, "status": res.status.value, "ok": res.ok, "message": res.message,
            "compile_s": round(res.seconds, 3), "backend": res.backend,
            "kernels": [{"name": k.name, "registers": k.registers, "spill_stores": k.spill_stores,
                         "spill_loads": k.spill_loads, "smem_static_bytes": k.smem_static,
                         "stack_frame_bytes": k.stack_frame} for k in res.kernels],
            "shapes": shapes}


def render_static(doc: dict[str, Any]) -> str:
    """The report as text: one line for the compile, one per kernel, one per launch."""
    lines = [f"compile {doc['arch']} ({doc['backend']}): {doc['status']} in {doc['compile_s']:.1f} s"
             + (f": {doc['message']}" if doc["message"] and not doc["ok"] else "")]
    for k in doc["kernels"]:
        lines.append(f"  kernel {k['name']}: {k['registers']} registers, spills {k['spill_stores']} B stored / "
                     f"{k['spill_loads']} B loaded, static smem {k['smem_static_bytes']} B, stack {k['stack_frame_bytes']} B")
    for s in doc["shapes"]:
        if "error" in s:
            lines.append(f"{s['shape']}: plan does not resolve: {s['error']}")
            continue
        lines.append(f"{s['shape']}: workspace {s['workspace_bytes']} B")
        for r in s["launches"]:
            lines.append(f"  launch {r['kernel']}: grid {tuple(r['grid'])} block {tuple(r['block'])} "
                         f"dynamic smem {r['smem_bytes']} B")
    return "\n".join(lines) + "\n"
