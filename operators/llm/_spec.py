"""One model's settings as the LLM operators see them (:class:`ModelSpec`), and the registry of the
backends that can serve it (:data:`LLM_BACKENDS`, a :class:`populations.Registry`: name -> a
factory taking a spec). Below the model table (``_models``) and the backends that take a spec
(``_openai``, ``_vllm``): they import it from here, so the table can build them without an import
cycle."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, Optional

from populations import Registry

if TYPE_CHECKING:
    from ._base import LLMBackend

__all__ = ["BACKENDS", "LLM_BACKENDS", "ModelSpec"]

#: LLM backends by name: ``LLM_BACKENDS.create(spec.backend, spec)`` builds one for a model. The
#: built-in factories are registered by the model table (``_models``), which imports each backend's
#: module only when its factory is called (torch, vllm, HTTP).
LLM_BACKENDS: Registry["LLMBackend"] = Registry("LLM backend")

#: The built-in backends' names (the spec strings ``openai:``, ``transformers:``, ``vllm:``).
BACKENDS = ("transformers", "openai", "vllm")


@dataclass(frozen=True)
class ModelSpec:
    """One model as the LLM operators see it: a name (the bandit's arm) and how to reach it."""

    name: str
    backend: str = "transformers"
    model: str = "smollm2-135m"
    device: str = "cpu"
    threads: int = 0
    base_url: str = ""
    api_key_env: str = ""
    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = 0.5
    concurrency: int = 4
    structured: str = "json_schema"
    lora: str = ""
    temperature: Optional[tuple[float, float]] = None
    price: float = 1.0
    max_model_len: int = 4096
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        if self.backend not in LLM_BACKENDS:
            raise ValueError(f"model {self.name!r}: backend must be one of {LLM_BACKENDS.names()}, "
                             f"got {self.backend!r}")
        if self.backend == "openai" and not self.base_url:
            raise ValueError(f"model {self.name!r}: the openai backend needs base_url")
        if self.structured not in ("json_schema", "guided_json", "none"):
            raise ValueError(f"model {self.name!r}: structured must be json_schema, guided_json or none")
        if self.temperature is not None:
            lo, hi = self.temperature
            if not 0 <= lo <= hi:
                raise ValueError(f"model {self.name!r}: temperature must be [lo, hi] with 0 <= lo <= hi")
        if self.timeout_s <= 0 or self.retries < 0 or self.concurrency < 1 or self.price <= 0:
            raise ValueError(f"model {self.name!r}: timeout_s, concurrency, price > 0 and retries >= 0 required")
