"""Where the LLM operators' model runs, and the GPU lease when it shares a timing GPU (issue 25).

``--llm-device`` says where the model runs: ``cpu`` (in-process transformers on the CPU: the GPU
is the timers' alone), ``cuda[:N]`` (in-process transformers on GPU N, or a local server / vLLM
declared to run there). When GPU N is one of the pool's GPUs the model is *co-located*: every
LLM operator gets that GPU's :class:`evaluators.run._lease.GpuLease` as its ``gate``, so generation
runs only between timed regions (one forward pass, or one server request, per slice) and the
timers never see its kernels. On a GPU outside the pool it is *separate*: no lease is needed,
its GPU seconds are still counted. Without ``--llm-device`` the models' own devices decide
(``operators/llm/models.toml``: ``device``); a server without one is reported as unplaced. The
placement is reported at run start (an ``llm_placement`` event and a progress line).
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

__all__ = ["LlmPlacement", "llm_placement", "place_llm", "device_index"]


@dataclass(frozen=True)
class LlmPlacement:
    """``where``: none (no LLM operator) | cpu | colocated | separate | unplaced (a server with no
    declared device); ``gpu``: the device index the model uses; ``lease``: the lease's key."""

    where: str
    device: str = ""
    gpu: Optional[int] = None
    pool_gpus: tuple[int, ...] = ()
    lease: Optional[str] = None

    def describe(self) -> str:
        if self.where == "none":
            return "no LLM operator"
        if self.where == "cpu":
            return "LLM on the CPU: the GPUs time alone"
        if self.where == "colocated":
            return (f"LLM co-located on GPU {self.gpu} with the timers: generation waits for timed regions "
                    f"(lease {self.lease})")
        if self.where == "separate":
            return f"LLM on GPU {self.gpu}, outside the pool's GPUs {list(self.pool_gpus)}: no lease needed"
        return "LLM served from elsewhere (no --llm-device): if the server shares a timing GPU, say --llm-device cuda:N"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["pool_gpus"] = list(self.pool_gpus)
        return d


def device_index(device: str) -> Optional[int]:
    """The GPU index of a torch-style device string (``cuda`` is 0), None for a CPU."""
    m = re.fullmatch(r"\s*(cuda|gpu)(?::(\d+))?\s*", device.lower())
    if not m:
        return None
    return int(m.group(2) or 0)


def llm_placement(operators: Mapping[str, Any], pool_gpus: Sequence[int], llm_device: Optional[str] = None,
                  key_of: Optional[Callable[[int], str]] = None) -> LlmPlacement:
    """Where ``operators``' models run (see the module docstring); ``key_of`` names a GPU's lease
    (default: ``evaluators.run._lease.gpu_key``)."""
    llms = [op for name, op in operators.items() if hasattr(op, "gate") and hasattr(op, "models")]
    if not llms:
        return LlmPlacement("none", pool_gpus=tuple(pool_gpus))
    device = llm_device or _model_device(llms[0])
    if device is None:
        return LlmPlacement("unplaced", pool_gpus=tuple(pool_gpus))
    gpu = device_index(device)
    if gpu is None:
        return LlmPlacement("cpu", device, pool_gpus=tuple(pool_gpus))
    if gpu not in pool_gpus:
        return LlmPlacement("separate", device, gpu, tuple(pool_gpus))
    if key_of is None:
        from evaluators import gpu_key as key_of
    return LlmPlacement("colocated", device, gpu, tuple(pool_gpus), key_of(gpu))


def _model_device(op: Any) -> Optional[str]:
    """The first model's device: a transformers spec's own, None for a server or vLLM."""
    try:
        spec = op._spec(op.models[0])
    except Exception:  # an unknown model fails later, where it is reported
        return None
    return spec.device if spec.backend == "transformers" else None


def place_llm(operators: Mapping[str, Any], placement: LlmPlacement,
              lease_factory: Optional[Callable[[str], Any]] = None) -> Any:
    """Give every LLM operator the co-located GPU's lease (and mark GPU-backed models so their
    GPU seconds count); returns the lease (None when there is none)."""
    lease = None
    if placement.where == "colocated":
        if lease_factory is None:
            from evaluators import GpuLease as lease_factory
        lease = lease_factory(placement.lease)
    for op in operators.values():
        if hasattr(op, "gate") and hasattr(op, "models"):
            op.gate = lease
            op.gpu_device = placement.where in ("colocated", "separate")
    return lease
