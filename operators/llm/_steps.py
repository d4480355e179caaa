"""The transformers backend's model steps: forward passes, the KV cache, sampling, GPU accounting.

:class:`ModelSteps` is a mix-in of :class:`~._transformers.TransformersBackend` (which holds the
model, the tokenizer and the prompt cache); the decoding loop (``_decode``) drives these steps.
Every kernel runs inside :meth:`ModelSteps._leased`: a gate slice when the model shares a timing
GPU, so a timed region waits for one step at most.
"""
from __future__ import annotations

import contextlib
import copy
import random
import time
import warnings
from typing import Any, Iterator, Optional, Sequence

from ._gil import short_switch_interval

__all__ = ["ModelSteps", "Cancelled", "MIN_REUSE"]

#: The shortest shared prefix worth starting a prefill from (a copy and a cut of a KV cache cost
#: more than computing a few tokens); every prompt shares its chat template's first ~10.
MIN_REUSE = 32


def _common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class Cancelled(Exception):
    """The caller's cancel event was set during a generation."""


class ModelSteps:
    """Forward passes, KV-cache reshaping, prompt prefill and sampling of a loaded causal LM."""

    #: prompt tokens per prefill forward pass (a cancelled generation stops between chunks)
    PREFILL_CHUNK = 256
    #: prompt tokens computed by prefills, and tokens taken from a cached prompt's shared prefix
    #: instead (class defaults; each backend counts its own from its first prefill)
    prefill_tokens = 0
    prefill_reused_tokens = 0

    torch: Any
    model: Any
    device: str
    hook: Any
    _cache: Any
    _cache_size: int

    @contextlib.contextmanager
    def _leased(self) -> Iterator[None]:
        """The context for GPU work of one generation: a gate slice when the model shares a
        timing GPU (waits for timed regions, ends synchronised), else nothing. Every kernel this
        backend launches (forward passes, the move to the GPU, KV-cache copies) runs inside one.

        Accounting (issue 35): the seconds from entering the slice to the device being
        synchronised at its end are *held* (:attr:`gpu_s`, on a GPU: the model's cost); the
        seconds before, waiting for timers to release the lease, are *waited*
        (:attr:`gpu_wait_s`), a delay the model did not cause and is not charged for. Inside a
        held slice the GIL's switch interval is short (:func:`._gil.short_switch_interval`), so
        the pass's ops do not wait 5 ms each for a busy engine thread to give the GIL back."""
        gate = getattr(self, "_gate", None)  # given only when the model shares a timing GPU
        on_gpu = str(self.device).startswith("cuda")
        sync = (lambda: self.torch.cuda.synchronize(self.device)) if on_gpu else None
        t0 = time.perf_counter()
        with (gate.slice(cancel=getattr(self, "_cancel_event", None)) if gate is not None  # we sync inside
              else contextlib.nullcontext()), short_switch_interval():
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
            raise Cancelled()
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
            raise Cancelled() from None
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
            raise Cancelled() from None

    def _prefill(self, ids: list[int]) -> tuple[Any, Any]:
        """The KV cache and last logits after the prompt ``ids``: a copy of the cached prefill
        when the prompt was seen (a few are kept), else computed in chunks and cached. A new
        prompt that shares a prefix of at least :data:`MIN_REUSE` tokens with a cached one (the
        same parent with other inspirations, the same context with another question) starts from
        a copy of that one's KV cache cut to the shared part, and only its own tail is computed
        (issue 35: "the prompt's prefix cached across calls where it does not change")."""
        key = tuple(ids)
        if key not in self._cache:
            past, start = self._reuse_prefix(key)
            logits = None
            self.prefill_tokens += len(ids) - start
            self.prefill_reused_tokens += start
            for at in range(start, len(ids), self.PREFILL_CHUNK):  # chunks: a cancel waits for one chunk at most
                # not through _forward: prompt tokens are not "fed after the prompt" (the hook's)
                past, rows = self._forward_rows([ids[at:at + self.PREFILL_CHUNK]], past)
                logits = rows[0]
            self._cache[key] = (past, logits)
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        past, logits = self._cache[key]
        try:
            with self._leased():  # copying a GPU KV cache runs kernels too
                return copy.deepcopy(past), logits
        except InterruptedError:
            raise Cancelled() from None

    def _reuse_prefix(self, key: tuple[int, ...]) -> tuple[Any, int]:
        """(KV cache, tokens it holds) of the cached prompt sharing the longest prefix with
        ``key``, cut to that prefix (at most all but ``key``'s last token, whose logits the caller
        computes), or (None, 0) when no cached prompt shares :data:`MIN_REUSE` tokens."""
        best, shared = None, 0
        for other in self._cache:
            n = _common_prefix(other, key)
            if n > shared:
                best, shared = other, n
        shared = min(shared, len(key) - 1)
        if best is None or shared < MIN_REUSE:
            return None, 0
        try:
            with self._leased():  # copying a GPU KV cache runs kernels
                past = copy.deepcopy(self._cache[best][0])
                extra = past.get_seq_length() - shared
                if extra > 0:  # a negative count removes that many (transformers 4 and 5 alike)
                    past.crop(-extra)
        except InterruptedError:
            raise Cancelled() from None
        return past, shared

    def _sample(self, logits: Any, ids: Optional[Sequence[int]], temperature: float, rng: random.Random) -> int:
        """A token drawn from ``logits`` (among ``ids`` when given), or the hook's choice."""
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
