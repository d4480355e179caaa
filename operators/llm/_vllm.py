"""In-process vLLM (``vllm.LLM``) with an optional LoRA adapter, behind the backend interface.

For a GPU machine with vLLM installed (or the vllm-cpu build): higher throughput than the
transformers loop, and LoRA adapters from the RL updates served per request. ``vllm`` is
imported when the backend is built, never at module import. Knob edits decode under the
grammar's JSON schema (vLLM's structured outputs; ``StructuredOutputsParams`` in recent
releases, ``GuidedDecodingParams`` in older ones); the answer is validated after either way.
A failed generation is returned as a :class:`Completion` with ``error``, never raised.

Adapters: the engine is built with LoRA enabled (one adapter at a time, rank up to
``MAX_LORA_RANK``), so :meth:`VLLMBackend.load_adapter` can switch to a new RL adapter without a
restart: every later request carries a ``LoRARequest`` for it (a new integer id per load, which
makes vLLM load the new weights rather than reuse a cached adapter).
"""
from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any, Optional

from ._base import Choices, Completion, Gate, LLMBackend
from ._spec import ModelSpec
from ._transformers import GGUF_MODELS

__all__ = ["VLLMBackend", "MAX_LORA_RANK"]

MAX_LORA_RANK = 16  # evo.rl's LoRA rank (LoraSettings.r); vLLM sizes its LoRA buffers by it


class VLLMBackend(LLMBackend):
    """One ``vllm.LLM`` for the process; ``spec.lora`` (a folder) is applied to every request until
    :meth:`load_adapter` switches to another adapter."""

    def __init__(self, spec: ModelSpec) -> None:
        import vllm  # deliberately lazy: vLLM is optional and heavy
        from vllm import SamplingParams

        self.spec = spec
        self.vllm = vllm
        self.SamplingParams = SamplingParams
        model = spec.model
        if model in GGUF_MODELS:  # vLLM wants a HF-format folder; the GGUF is for transformers
            raise ValueError(f"model {model!r} is a GGUF in a wheel; give vLLM a HF-format folder "
                             "(scripts/setup_vllm_cpu.sh converts the default model into one)")
        kwargs: dict[str, Any] = {"model": model, "max_model_len": spec.max_model_len, "enforce_eager": True,
                                  "enable_lora": True, "max_loras": 1, "max_lora_rank": MAX_LORA_RANK}
        kwargs.update(spec.extra)
        self.llm = vllm.LLM(**kwargs)
        self.lora = None
        self.adapter = ""  # the RL adapter in use (load_adapter); "" for the base model or spec.lora
        self._lora_ids = 0
        self._lock = threading.Lock()
        if spec.lora:
            self._set_lora("evo-adapter", spec.lora)
        self.name = spec.name if spec.lora else model_folder_name(model)

    def _set_lora(self, name: str, folder: str) -> None:
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1
        self.lora = LoRARequest(name, self._lora_ids, folder)

    def load_adapter(self, folder: Any, name: str, gate: Optional[Gate] = None) -> None:
        """Answer with the peft LoRA adapter in ``folder`` (recorded as ``name``) from the next
        completion on; ``folder=None`` goes back to the base model. Nothing reaches the GPU here
        (vLLM loads the adapter at the next request, inside that request's slice), so ``gate``
        is not needed."""
        with self._lock:
            if folder is None:
                self.lora, self.adapter = None, ""
            else:
                self._set_lora(name or "evo-adapter", str(Path(folder).resolve()))
                self.adapter = name

    def _params(self, temperature: float, max_new_tokens: int, seed: int, schema: Any) -> Any:
        kwargs: dict[str, Any] = {"temperature": temperature, "max_tokens": max_new_tokens, "seed": seed}
        if schema is not None:
            try:  # vLLM >= 0.10.2
                from vllm.sampling_params import StructuredOutputsParams
                kwargs["structured_outputs"] = StructuredOutputsParams(json=schema)
            except ImportError:  # older releases
                from vllm.sampling_params import GuidedDecodingParams
                kwargs["guided_decoding"] = GuidedDecodingParams(json=schema)
        return self.SamplingParams(**kwargs)

    def complete(self, messages: list[dict[str, str]], *, rng: random.Random, temperature: float = 0.7,
                 max_new_tokens: int = 256, prefix: str = "", grammar: Optional[Choices] = None,
                 cancel: Optional[threading.Event] = None, gate: Optional[Gate] = None) -> Completion:
        """One answer (``prefix`` is not continued; the grammar's JSON schema constrains decoding;
        ``cancel`` and ``gate`` are the caller's, around the whole request)."""
        start = time.perf_counter()
        params = self._params(temperature, max_new_tokens, rng.getrandbits(31), self.json_schema(grammar))
        try:
            with self._lock:  # vllm.LLM is not meant to be driven from several threads at once
                out = self.llm.chat([messages], params, lora_request=self.lora, use_tqdm=False)[0]
        except Exception as exc:  # an engine error is a counted outcome, not the end of the run
            return self.failure(f"vllm: {type(exc).__name__}: {exc}", time.perf_counter() - start, temperature)
        gen = out.outputs[0]
        return Completion(text=gen.text, prompt_tokens=len(out.prompt_token_ids or ()),
                          completion_tokens=len(gen.token_ids or ()), seconds=time.perf_counter() - start,
                          model=self.name, temperature=temperature, finished=gen.finish_reason != "length",
                          adapter=self.adapter)


def model_folder_name(model: str) -> str:
    """A short model name for the archive: a folder's last part, else the id as given."""
    return model.rstrip("/").rsplit("/", 1)[-1] if model.startswith(("/", ".")) else model

