"""The LLM backend interface: chat messages in, one :class:`Completion` out (or ``n`` of them
for one prompt, :meth:`LLMBackend.complete_many`).

An :class:`LLMBackend` serves one model: in-process ``transformers`` (our own sampling loop,
grammar-constrained, gated per forward pass), an OpenAI-compatible HTTP server, or in-process
vLLM. The LLM operators and the RL loop see only this interface; which backend serves a model is
data (``operators/llm/models.toml``, :func:`~operators.llm.get_backend`).

A backend never raises for a failed generation: a timeout, a refused request, a cancelled call
or an engine error is a Completion with ``error`` set and no text, counted by the caller like
any other outcome. ``tests/test_llm_conformance.py`` runs this contract over every backend.
"""
from __future__ import annotations

import abc
import random
import threading
from dataclasses import dataclass
from typing import Any, Optional, Protocol, Sequence

__all__ = ["Completion", "LLMBackend", "Gate", "Choices"]


@dataclass(frozen=True)
class Completion:
    """One answer with its accounting."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    seconds: float
    model: str
    temperature: float
    finished: bool = True  # False when max_new_tokens cut it off or a grammar hit a dead end
    adapter: str = ""  # the LoRA adapter version that answered (evo.rl); "" for the base model
    error: str = ""  # why there is no answer (a timeout, an HTTP error, a garbage reply); "" when there is one
    gpu_s: float = 0.0  # seconds the model held a GPU for this answer (its lease slices, device-synchronised)
    gpu_wait_s: float = 0.0  # seconds it waited for the GPU lease (timers held the GPU): not its cost, a delay


class Gate(Protocol):
    """A device lease generation takes per slice (evaluators' GpuLease: no timed region on the
    GPU overlaps a slice; evo hands one to the LLM operators when the model shares a timing GPU)."""

    def slice(self, sync: Optional[Any] = None, cancel: Optional[threading.Event] = None) -> Any: ...


class Choices(Protocol):
    """A grammar as successive choices: ``options()`` lists the prefix-free strings allowed next
    (empty when finished or stuck), ``choose(s)`` records one. A grammar may also offer
    ``json_schema()``, which backends that cannot step a grammar hand to their server, and
    ``narrow(options)``, which the in-process decoding loop calls after each token inside an
    option with the options the text still allows (:class:`~._claims.BatchClaims` keeps its
    row's reservation on one of them)."""

    done: bool

    def options(self) -> list[str]: ...

    def choose(self, option: str) -> None: ...


class LLMBackend(abc.ABC):
    """Base class of LLM backends (see the module docstring)."""

    #: The model's name as Completions and candidates record it.
    name: str = ""
    #: The version name of the LoRA adapter in use (:meth:`load_adapter`); "" for the base model.
    adapter: str = ""
    #: True when :meth:`complete` honours ``cancel`` and ``gate`` itself, between decoding steps
    #: (the in-process transformers loop). False: it ignores them, and the caller checks
    #: ``cancel`` before a request and holds one ``gate`` slice around the whole request.
    steps_under_gate: bool = False

    @abc.abstractmethod
    def complete(self, messages: list[dict[str, str]], *, rng: random.Random, temperature: float = 0.7,
                 max_new_tokens: int = 256, prefix: str = "", grammar: Optional[Choices] = None,
                 cancel: Optional[threading.Event] = None, gate: Optional[Gate] = None) -> Completion:
        """An answer to ``messages``, drawing any randomness from ``rng`` (the same seed gives the
        same answer where the backend can promise it). ``prefix``: the answer's start (a backend
        that cannot continue a prefix sends the messages alone). ``grammar``: decode under it
        (step by step, or through its ``json_schema()``, or not at all: the caller validates the
        answer anyway). ``cancel``/``gate``: see :attr:`steps_under_gate`."""

    def complete_many(self, messages: list[dict[str, str]], n: int, *, rng: random.Random,
                      temperature: float = 0.7, max_new_tokens: int = 256, prefix: str = "",
                      grammars: Optional[Sequence[Optional[Choices]]] = None,
                      cancel: Optional[threading.Event] = None, gate: Optional[Gate] = None) -> list[Completion]:
        """``n`` answers to one prompt, in order, row ``i`` decoded under ``grammars[i]`` (one
        grammar object per row: a grammar is stateful; ``None`` for free rows). The same ``rng``
        seed gives the same list where the backend can promise it. Accounting is split so that
        the rows' sums are the call's cost: a backend that shares the prompt among the rows
        counts its tokens once over the rows (not once per row), and divides shared seconds and
        GPU seconds among them (see the backend's docstring for its rule).

        The default asks :meth:`complete` once per row, in order, drawing from ``rng`` in turn
        (so each row's accounting is its own request's); once ``cancel`` is set, the rows not yet
        asked are ``cancelled`` failures. A backend that can sample several rows of one prompt
        together (the in-process transformers loop) overrides it."""
        rows = _rows(n, grammars)
        out: list[Completion] = []
        for grammar in rows:
            if cancel is not None and cancel.is_set():
                out.append(self.failure("cancelled", 0.0, temperature))
                continue
            out.append(self.complete(messages, rng=rng, temperature=temperature, max_new_tokens=max_new_tokens,
                                     prefix=prefix, grammar=grammar, cancel=cancel, gate=gate))
        return out

    def warm(self, gate: Optional[Gate] = None) -> None:
        """Be ready to answer at once: an in-process model on its device, after one forward pass
        (inside one ``gate`` slice when it shares a timing GPU). evo calls it before a run's budget
        clock starts, so a first call is no slower than the next; its cost is charged to no
        completion. The default does nothing (a server is warm or not on its own side)."""

    def load_adapter(self, folder: Any, name: str, gate: Optional[Gate] = None) -> None:
        """Answer with the peft LoRA adapter in ``folder`` (recorded as ``name``) from the next
        completion on; ``folder=None`` goes back to the base model. ``gate``: the timing GPU's
        lease when the model shares it; weights put on that GPU are put there inside one slice
        (as every generation kernel is). The default refuses: a backend that cannot switch
        adapters says so rather than answering with the old weights."""
        raise NotImplementedError(f"{type(self).__name__} cannot load LoRA adapters")

    # -- for implementations -----------------------------------------------------------------
    def failure(self, error: str, seconds: float, temperature: float, prompt_tokens: int = 0,
                gpu_s: float = 0.0, gpu_wait_s: float = 0.0) -> Completion:
        """The Completion of a call that produced no answer, ``error`` saying why."""
        return Completion(text="", prompt_tokens=prompt_tokens, completion_tokens=0, seconds=seconds,
                          model=self.name, temperature=temperature, finished=False, error=error, gpu_s=gpu_s,
                          gpu_wait_s=gpu_wait_s)

    @staticmethod
    def json_schema(grammar: Any) -> Optional[dict]:
        """The grammar's JSON schema, for a backend whose server decodes under one; None when the
        grammar offers none (or there is no grammar)."""
        schema_of = getattr(grammar, "json_schema", None)
        return schema_of() if callable(schema_of) else None


def _rows(n: int, grammars: Optional[Sequence[Optional[Choices]]]) -> list[Optional[Choices]]:
    """The per-row grammars of a :meth:`LLMBackend.complete_many` call (checked: one per row)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    rows = list(grammars) if grammars is not None else [None] * n
    if len(rows) != n:
        raise ValueError(f"complete_many: {len(rows)} grammars for {n} rows (give one per row, or none)")
    if len({id(g) for g in rows if g is not None}) != sum(g is not None for g in rows):
        raise ValueError("complete_many: a grammar is stateful; give each row its own")
    return rows
