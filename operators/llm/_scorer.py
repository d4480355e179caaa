"""The LLM as a cost model: how likely the model finds each child's knob edit (issue 35).

:class:`LLMScorer` scores candidates by the log-likelihood the in-process transformers model
gives each child's knob edit (``{"KNOB": value, ...}`` of the knobs that differ from the parent,
what the knob grammar decodes) after the LLM operator's own mutation prompt for the parent at
the shape: one prefill of the prompt (kept in the backend's prefix cache), its KV cache expanded
to one row per candidate (``rows_per_pass`` rows at a time, since each row copies the prompt's
cache), and one teacher-forced forward pass over those edits, right-padded (a pad after a row's
last token cannot change that row's earlier logits). Every
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
from ._models import get_backend
from ._operator import LLMOperator
from ._steps import Cancelled
from ._transformers import DEFAULT_MODEL

__all__ = ["LLMScorer", "UNSCORED", "scored_edit"]

#: The score of a candidate the model cannot score (no parent, another template, no knobs).
UNSCORED = -1e9


def scored_edit(template: Any, parent_knobs: Any, knobs: Any) -> str:
    """A child's knob edit as the scorer scores it (and the knob grammar decodes it): a JSON object
    of the knobs that differ from the parent's, the parent's unset knobs at their defaults.
    ``evo rl rank`` trains on exactly this text."""
    base = dict(template.space.complete(dict(parent_knobs)))
    return json.dumps({k: v for k, v in sorted(dict(knobs).items()) if base.get(k) != v})


class LLMScorer(CostModel):
    """Log-likelihood of each child's knob edit under the in-process model (module docstring)."""

    name = "llm"
    learns_online = False

    def __init__(self, *, model: str = DEFAULT_MODEL, model_config: Sequence[str] = (), device: Optional[str] = None,
                 threads: Optional[int] = None, adapter: Optional[str] = None, inspirations: int = 2,
                 rows_per_pass: int = 8, gate: Any = None) -> None:
        super().__init__()
        if rows_per_pass < 1:
            raise ValueError(f"rows_per_pass must be >= 1, got {rows_per_pass!r}")
        self.model, self.model_config, self.device, self.threads = model, tuple(model_config), device, threads
        self.adapter, self.gate, self.inspirations, self.rows_per_pass = adapter, gate, inspirations, rows_per_pass
        self.prompter = self._prompter()  # prompts, and the model's spec: loads nothing
        self.history: dict[str, list[Record]] = defaultdict(list)  # measured records by shape: the prompts'
        self._backend: Any = None
        self._templates: Optional[dict[str, Any]] = None
        self._held_s = self._wait_s = 0.0  # GPU seconds of scoring not yet taken (take_gpu_seconds)

    def _prompter(self) -> LLMOperator:
        return LLMOperator(model=self.model, model_config=self.model_config, device=self.device,
                           threads=self.threads, inspirations=self.inspirations)

    def __getstate__(self) -> dict[str, Any]:  # save(): the records and settings, not the model
        return {**self.__dict__, "_backend": None, "gate": None, "_templates": None, "prompter": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.prompter = self._prompter()

    def backend(self) -> Any:
        """The in-process transformers model, the very backend the LLM operators of the process
        use for this model (so ``evo run --llm-adapter`` switches it too); ``adapter`` switched
        in when given."""
        if self._backend is None:
            backend = get_backend(self.prompter._spec(self.model))
            if not getattr(backend, "steps_under_gate", False) or not hasattr(backend, "_prefill"):
                raise ValueError(f"model {self.model}: the LLM scorer needs an in-process transformers model")
            if self.adapter and backend.adapter != str(self.adapter):
                backend.load_adapter(self.adapter, str(self.adapter), gate=self.gate)
            self._backend = backend
        return self._backend

    def warm(self) -> dict[str, str]:
        """Load the model and run one pass (inside a lease slice) before a run's clock starts."""
        try:
            self.backend().warm(gate=self.gate)
            return {self.model: "ready"}
        except Exception as exc:  # reported; scoring then fails as each call's counted failure
            return {self.model: f"could not load: {type(exc).__name__}: {exc}"}

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
        rows, edits = [], []
        for i, c in enumerate(candidates):
            if c.template == parent.template and c.knobs is not None:
                rows.append(i)
                edits.append(scored_edit(template, parent.candidate.knobs, c.knobs))
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
        pad = next(iter(backend.eos)) if backend.eos else 0
        out: list[float] = []
        with backend._lock:
            backend._gate = self.gate
            held0, wait0 = backend._gpu_clock()
            try:
                prompt = backend.prompt_ids(messages)
                for at in range(0, len(seqs), self.rows_per_pass):  # the KV cache copied per row: bounded
                    out += self._pass(backend, prompt, seqs[at:at + self.rows_per_pass], pad)
            except Cancelled:
                out += [UNSCORED] * (len(seqs) - len(out))
            finally:
                backend._gate = None
                held1, wait1 = backend._gpu_clock()
                self._held_s += held1 - held0
                self._wait_s += wait1 - wait0
        return out

    @staticmethod
    def _pass(backend: Any, prompt: list[int], seqs: list[list[int]], pad: int) -> list[float]:
        """Summed log-probabilities of ``seqs`` after ``prompt``: the prompt's cached prefill,
        its KV cache expanded to the rows, one teacher-forced pass over the right-padded rows."""
        torch = backend.torch
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
        past, first = backend._prefill(prompt)
        if len(seqs) > 1:
            backend._reshape_cache(past, repeat=len(seqs))
        with torch.inference_mode(), warnings.catch_warnings(), backend._leased():
            warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames past_key_values
            backend.place()
            logits = backend.model(input_ids=ids.to(backend.device), past_key_values=past,
                                   use_cache=True).logits.float().cpu()
        first_lp = torch.log_softmax(first.double(), dim=-1)
        rest_lp = torch.log_softmax(logits.double(), dim=-1)
        out = []
        for r, s in enumerate(seqs):
            total = float(first_lp[s[0]])
            for j in range(1, len(s)):
                total += float(rest_lp[r, j - 1, s[j]])
            out.append(total)
        return out
