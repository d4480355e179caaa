"""The policy RL trains: a LoRA-adapted copy of a transformers backend's model.

The copy samples through the backend's own grammar-constrained loop (the operator's decoding,
so training sees exactly the distribution the operator proposes from) with a trace of every
sampled step: the allowed token ids and the chosen one. The policy's probability of a
completion is the product, over those steps, of the softmax restricted to the allowed tokens;
steps the grammar determined (one live string) have probability 1 and carry no gradient.

The prompt's KV cache is computed without gradient under the current weights: the gradient
flows through the completion tokens' own forward pass (and the last prompt token's, whose
logits choose the first token), not back through the prompt's keys and values. This truncated
gradient saves a ~1000-token backward pass per step on CPU; the log-probabilities themselves
are exact. The reference model for the KL term is the same network with the adapter disabled.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence, Union

from operators.llm import PREFIX, DecodeHook, TransformersBackend

__all__ = ["LoraSettings", "Policy", "Sample", "model_hash", "adapter_hash"]

LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class LoraSettings:
    """peft LoraConfig fields we set (dropout 0: training and sampling see one network)."""

    r: int = 16
    alpha: int = 32
    targets: tuple[str, ...] = LLAMA_TARGETS

    def config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=0.0, target_modules=list(self.targets),
                          bias="none", task_type="CAUSAL_LM")


@dataclass
class Sample:
    """One sampled completion with its trace: ``ids`` are the completion's tokens (after the
    prompt and ``PREFIX``), ``steps`` the sampled ones as (index into ids, allowed ids, chosen)."""

    text: str
    finished: bool
    ids: list[int] = field(default_factory=list)
    steps: list[tuple[int, list[int], int]] = field(default_factory=list)
    temperature: float = 1.0


class _Unreachable(Exception):
    """A forced completion that the grammar cannot spell."""


class _Tracer(DecodeHook):
    """The backend's decoding hook that records a :class:`Sample`'s trace; with ``force`` set,
    every sampled step takes the allowed token that spells most of the forced text (replaying an
    archived completion through the same grammar)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.trace: Optional[Sample] = None
        self.force: Optional[str] = None

    def fed(self, ids: Sequence[int]) -> None:
        if self.trace is not None:
            self.trace.ids.extend(int(i) for i in ids)
            if self.force is not None:
                text = self.tokenizer.decode(list(ids))
                if not self.force.startswith(text):
                    raise _Unreachable(text)
                self.force = self.force[len(text):]

    def choose(self, allowed: Optional[Sequence[int]], sample: Callable[[], int]) -> int:
        if self.force is not None and allowed is not None:
            fits = [(len(piece), i) for i in allowed
                    if (piece := self.tokenizer.decode([i])) and self.force.startswith(piece)]
            if not fits:
                raise _Unreachable(self.force)
            tok = max(fits)[1]
        else:
            tok = sample()
        if self.trace is not None and allowed is not None:
            self.trace.steps.append((len(self.trace.ids), [int(i) for i in allowed], tok))
        return tok


def model_hash(model: Any) -> str:
    """sha256 over the base model's parameter names and bytes (LoRA weights excluded)."""
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        if "lora_" in name:
            continue
        h.update(name.replace("base_model.model.", "").encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def adapter_hash(folder: Union[str, os.PathLike]) -> str:
    """sha256 of a saved adapter's weights file (what a version is named after)."""
    folder = Path(folder)
    files = sorted(folder.glob("adapter_model.*"))
    if not files:
        raise FileNotFoundError(f"no adapter_model.* in {folder}")
    h = hashlib.sha256()
    for f in files:
        h.update(f.read_bytes())
    return h.hexdigest()


class Policy:
    """A trainable LoRA copy of ``backend``'s model (see the module docstring)."""

    def __init__(self, backend: TransformersBackend, *, lora: LoraSettings = LoraSettings(), seed: int = 0,
                 init_adapter: Optional[Union[str, os.PathLike]] = None, gate: Any = None) -> None:
        import torch
        from peft import PeftModel, get_peft_model

        self.torch = torch
        self.backend = backend
        self.lora = lora
        #: the timing GPU's lease when the policy trains on it (``evo run --rl-every`` with the model
        #: co-located): every GPU step of training holds a slice of it (:meth:`leased`)
        self.gate = gate
        self._local = threading.local()
        self._device = backend.device
        # the backend moves its model to the GPU lazily (at its first leased forward pass); the
        # trained copy goes there now, inside a slice when a gate is given
        with self.leased():
            # the base without the adapter the backend may serve (merged into its served copy)
            base = copy.deepcopy(backend.base_model).to(backend.device)
            if isinstance(base, PeftModel):  # a backend that wraps its model in peft: train from the base
                base = base.unload()
            self.base_hash = model_hash(base)
            torch.manual_seed(seed)
            if init_adapter is not None:
                self.model = PeftModel.from_pretrained(base, str(init_adapter), is_trainable=True)
            else:
                self.model = get_peft_model(base, lora.config())
        self.model.eval()  # no dropout anywhere; gradients still flow
        # the operators' own decoding loop (grammar, caches) over the policy's model, traced by a hook
        self.sampler = backend.with_model(self.model)
        self.tracer = _Tracer(backend.tokenizer)
        self.sampler.hook = self.tracer
        self._train_past: dict[tuple[int, ...], Any] = {}
        self._ref_past: dict[tuple[int, ...], Any] = {}

    # -- the GPU lease -------------------------------------------------------------------------
    def leased(self) -> Any:
        """A context for GPU work of training: one slice of :attr:`gate` (it waits while a region
        is timed and ends with the device synchronised), or nothing without a gate or inside a
        slice already (slices do not nest: the gate is an exclusive lock)."""
        if self.gate is None or getattr(self._local, "inside", False):
            return contextlib.nullcontext()
        return self._slice()

    @contextlib.contextmanager
    def _slice(self) -> Any:
        on_gpu = str(self._device).startswith("cuda")
        with self.gate.slice(sync=(lambda: self.torch.cuda.synchronize(self._device)) if on_gpu else None):
            self._local.inside = True
            try:
                yield
            finally:
                self._local.inside = False

    def _sample_gate(self) -> Any:
        """The gate the sampling loop takes per forward pass (None inside a slice already)."""
        return None if getattr(self._local, "inside", False) else self.gate

    # -- prompts and caches --------------------------------------------------------------------
    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        return self.sampler.prompt_ids(messages, PREFIX)

    def _prefix(self, ids: list[int], reference: bool) -> Any:
        """KV cache of all prompt tokens but the last, without gradient (the reference's is kept)."""
        torch = self.torch
        key = tuple(ids)
        cache = self._ref_past if reference else self._train_past
        if key not in cache:
            with torch.no_grad(), self.leased():
                if reference:
                    with self.model.disable_adapter():
                        out = self.model(input_ids=torch.tensor([ids[:-1]], device=self.sampler.device), use_cache=True, logits_to_keep=1)
                else:
                    out = self.model(input_ids=torch.tensor([ids[:-1]], device=self.sampler.device), use_cache=True, logits_to_keep=1)
                    # the sampler's prefill of the whole prompt, from this one (saves a prompt pass)
                    full = copy.deepcopy(out.past_key_values)
                    last = self.model(input_ids=torch.tensor([ids[-1:]], device=self.sampler.device), past_key_values=full, use_cache=True)
                    self.sampler.remember_prompt(key, last.past_key_values, last.logits[0, -1].double().cpu())
            cache[key] = out.past_key_values
        return cache[key]

    def weights_changed(self) -> None:
        """Drop every cache computed under the old weights (call after each optimiser step)."""
        self._train_past.clear()
        self.sampler.clear_cache()

    # -- sampling ------------------------------------------------------------------------------
    def sample(self, messages: list[dict[str, str]], grammar: Any, rng: Any, temperature: float = 1.0) -> Sample:
        """One constrained completion of ``messages`` with its trace."""
        self._prefix(self.prompt_ids(messages), reference=False)
        trace = Sample(text="", finished=False, temperature=temperature)
        self.tracer.trace = trace
        try:
            c = self.sampler.complete(messages, rng=rng, temperature=temperature, max_new_tokens=64, prefix=PREFIX,
                                      grammar=grammar, gate=self._sample_gate())
        finally:
            self.tracer.trace = None
        trace.text, trace.finished = c.text, c.finished
        return trace

    def replay(self, messages: list[dict[str, str]], grammar: Any, text: str, temperature: float = 1.0) -> Optional[Sample]:
        """The trace of an archived completion ``text`` (which starts with PREFIX) as if this policy
        had sampled it under ``grammar``; None when the grammar cannot spell it."""
        if not text.startswith(PREFIX):
            return None
        self._prefix(self.prompt_ids(messages), reference=False)
        trace = Sample(text="", finished=False, temperature=temperature)
        self.tracer.trace, self.tracer.force = trace, text[len(PREFIX):]
        try:
            c = self.sampler.complete(messages, rng=None, temperature=temperature, max_new_tokens=64, prefix=PREFIX,
                                      grammar=grammar, gate=self._sample_gate())
        except _Unreachable:
            return None
        finally:
            self.tracer.trace, self.tracer.force = None, None
        if c.text != text or not c.finished:
            return None
        trace.text, trace.finished = c.text, True
        return trace

    # -- log-probabilities ---------------------------------------------------------------------
    def logprobs(self, prompt: list[int], sample: Sample, reference: bool = False) -> Any:
        """Log-probabilities of the sampled steps under the restricted softmax (a 1-d tensor with
        gradient unless ``reference``)."""
        torch = self.torch
        with self.leased():
            past = copy.deepcopy(self._prefix(prompt, reference))
            x = torch.tensor([prompt[-1:] + sample.ids], device=self.sampler.device)
            if reference:
                with torch.no_grad(), self.model.disable_adapter():
                    logits = self.model(input_ids=x, past_key_values=past, use_cache=True).logits[0]
            else:
                logits = self.model(input_ids=x, past_key_values=past, use_cache=True).logits[0]
            out = []
            for j, allowed, chosen in sample.steps:
                sub = logits[j, allowed].float() / sample.temperature
                out.append(torch.log_softmax(sub, dim=0)[allowed.index(chosen)])
            return torch.stack(out) if out else torch.zeros(0)

    def trainable(self) -> list[Any]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def save(self, folder: Union[str, os.PathLike]) -> str:
        """Save the adapter (peft format) and return its hash."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(str(folder))
        return adapter_hash(folder)

    def settings(self) -> dict[str, Any]:
        return {"lora": {**asdict(self.lora), "targets": list(self.lora.targets)}, "base_model": self.backend.name}
