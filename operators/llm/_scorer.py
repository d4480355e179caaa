"""The LLM as a cost model: how likely the model finds each child's knob edit (issue 35).

:class:`LLMScorer` scores candidates by the log-likelihood the in-process transformers model
gives each child's knob edit (``{"KNOB": value, ...}`` of the knobs that differ from the parent,
what the knob grammar decodes) after the LLM operator's own mutation prompt for the parent at
the shape: one prefill of the prompt (from the backend's prefix cache when it is there), its KV
cache expanded to one row per candidate, and one teacher-forced forward pass over all the edits,
right-padded (a pad after a row's last token cannot change that row's earlier logits). Every
GPU operation runs inside the backend's lease slices (``gate``), as generation does.

What it learns online: the measured records it is shown become the prompt's history (the
shape's best siblings are its inspirations), so it conditions on them in context; its weights
learn offline (``adapter``: a LoRA adapter trained with ``evo rl train`` on ``evo rl export
--pairs`` data). Zero-shot, the base model ranks worse than random (issue 35's measurements), so
:attr:`learns_online` is False: the conformance suite checks its contract, not its ranking.
Candidates it cannot score (no parent, another template than the parent's, no knobs) get
:data:`UNSCORED`, a finite value below every log-likelihood, so a ranker keeps a total order.
"""
from __future__ import annotations

import json
import warnings
from collections import defaultdict
from typing import Any, Optional, Sequence

from populations import Candidate, Shape

from .._base import OperatorContext, ParentView
from .._costmodel import CostModel, Record
from ._operator import LLMOperator
from ._transformers import DEFAULT_MODEL, _Cancelled, load_backend

__all__ = ["LLMScorer", "UNSCORED"]

#: The score of a candidate the model cannot score (no parent, another template, no knobs).
UNSCORED = -1e9


class LLMScorer(CostModel):
    """Log-likelihood of each child's knob edit under the in-process model (module docstring)."""

    name = "llm"
    learns_online = False

    def __init__(self, *, model: str = DEFAULT_MODEL, device: str = "cpu", threads: int = 0,
                 adapter: Optional[str] = None, inspirations: int = 2, gate: Any = None) -> None:
        super().__init__()
        self.model, self.device, self.threads, self.adapter = model, device, threads, adapter
        self.gate, self.inspirations = gate, inspirations
        self.prompter = LLMOperator(model=model, inspirations=inspirations)  # prompts only: loads nothing
        self.history: dict[str, list[Record]] = defaultdict(list)
        self._backend: Any = None
        self._templates: Optional[dict[str, Any]] = None
        self._held_s = self._wait_s = 0.0  # GPU seconds of scoring not yet taken (take_gpu_seconds)

    def __getstate__(self) -> dict[str, Any]:  # save(): the records and settings, not the model
        return {**self.__dict__, "_backend": None, "gate": None, "_templates": None, "prompter": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.prompter = LLMOperator(model=self.model, inspirations=self.inspirations)

    def backend(self) -> Any:
        """The in-process model (loaded once per process; the adapter switched in when given)."""
        if self._backend is None:
            backend = load_backend(self.model, self.device, self.threads)
            if self.adapter and backend.adapter != self.adapter:
                backend.load_adapter(self.adapter, str(self.adapter), gate=self.gate)
            self._backend = backend
        return self._backend

    def _learn(self, records: list[Record]) -> None:
        for cand, ev in records:
            self.history[str(ev.shape)].append((cand, ev))

    def predict(self, shape: Shape, candidates: Sequence[Candidate],
                parent: Optional[ParentView] = None) -> list[float]:
        if not candidates:
            return []
        if parent is None or parent.candidate.knobs is None or not parent.template:
            return [UNSCORED] * len(candidates)
        if self._templates is None:
            from populations import load_templates
            self._templates = load_templates(errors="warn")
        template = self._templates.get(parent.template)
        if template is None:
            return [UNSCORED] * len(candidates)
        context = OperatorContext(history=self.history.get(str(shape), ()), templates={template.name: template})
        messages = self.prompter.messages([parent], shape, context, context.template(template.name))
        base = dict(template.space.complete(dict(parent.candidate.knobs)))
        rows, edits = [], []
        for i, c in enumerate(candidates):
            if c.template == parent.template and c.knobs is not None:
                rows.append(i)
                edits.append(json.dumps({k: v for k, v in sorted(c.knobs.items()) if base.get(k) != v}))
        out = [UNSCORED] * len(candidates)
        for i, lp in zip(rows, self.logprobs(messages, edits) if edits else []):
            out[i] = lp
        return out

    def take_gpu_seconds(self) -> float:
        """Seconds scoring held a GPU since the last call (0 on the CPU): the ranker's model cost."""
        held, self._held_s = self._held_s, 0.0
        return held

    def take_gpu_wait_seconds(self) -> float:
        """Seconds scoring waited for the GPU lease since the last call (reported, not charged)."""
        wait, self._wait_s = self._wait_s, 0.0
        return wait

    def logprobs(self, messages: list[dict[str, str]], continuations: Sequence[str]) -> list[float]:
        """Summed log-probabilities of each continuation after ``messages``' generation prompt:
        one prefill, one teacher-forced pass over all rows (see the module docstring)."""
        backend = self.backend()
        torch = backend.torch
        tok = backend.tokenizer
        seqs = [tok.encode(text, add_special_tokens=False) for text in continuations]
        width = max(len(s) for s in seqs)
        pad = next(iter(backend.eos)) if backend.eos else 0
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
        with backend._lock:
            backend._gate = self.gate
            held0, wait0 = backend._gpu_clock()
            try:
                past, first = backend._prefill(backend.prompt_ids(messages))
                backend._reshape_cache(past, repeat=len(seqs))
                with torch.inference_mode(), warnings.catch_warnings(), backend._leased():
                    warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames past_key_values
                    backend.place()
                    logits = backend.model(input_ids=ids.to(backend.device), past_key_values=past,
                                           use_cache=True).logits.float().cpu()
            except _Cancelled:
                return [UNSCORED] * len(seqs)
            finally:
                backend._gate = None
                held1, wait1 = backend._gpu_clock()
                self._held_s += held1 - held0
                self._wait_s += wait1 - wait0
        first_lp = torch.log_softmax(first.double(), dim=-1)
        rest_lp = torch.log_softmax(logits.double(), dim=-1)
        out = []
        for r, s in enumerate(seqs):
            total = float(first_lp[s[0]])
            for j in range(1, len(s)):
                total += float(rest_lp[r, j - 1, s[j]])
            out.append(total)
        return out
