"""The LLM operator: a model reads a parent (its knobs, measurements, maybe its source) and
writes a child.

Modes (``mode=``): ``knobs`` (default; a JSON knob edit of a template candidate, decoded under
:class:`KnobEditGrammar` so that every finished answer is a valid, new knob set: the mode small
models can do), ``edits`` (SEARCH/REPLACE edits against the parent's source) and ``source`` (a
whole translation unit); the last two give candidates without a template, keeping the parent's
launch plan. A parent that failed gets the ``fix`` prompt, else ``mutation`` (``crossover`` when
the operator has arity 2 and two parents of one template; else the fitter one is mutated).
Temperatures are drawn per call from
``temperature`` (or the model's own range); tokens, seconds, the model, the prompt and the
answer go into the candidate (tokens and seconds in ``meta``).

Models: ``model`` names one, ``models`` several (names from ``operators/llm/models.toml`` or
``model_config`` files, or spec strings, see :mod:`._models`); with several, a
:class:`ModelBandit` picks one per call by improvements per token, learning from :meth:`tell`
whether a child beat its parent. ``device`` forces in-process transformers models onto a
device (``cpu`` on the GPU machine, so timing has the GPU alone). :meth:`take_tokens` hands
the engine every token spent, failed calls included, for the ``--max-tokens`` budget, and
:meth:`take_gpu_seconds` the seconds the model ran on a GPU (its cost for the operator bandit).

``batch`` (issue 25): knob-mode children are sampled together, all ``n`` of a :meth:`propose`
call in one :meth:`LLMBackend.complete_many` call (one prompt prefill and one forward pass per
step for all rows on the in-process model, whose step costs about the same for 8 rows as for
1); ``batch`` is how many children the engine asks of one call (``ModelOperator.batch``). Rows of
one call avoid each other's knob sets and repeats are dropped. The other modes ask one at a time.

``gate`` (issue 25): a device lease (``evaluators.run._lease.GpuLease``) that evo passes when the
model shares a GPU with the timing workers (``--llm-device`` names one of the pool's GPUs). An
in-process transformers model then runs each forward pass as one slice of it; other backends
(a local server, in-process vLLM) hold one slice per request. ``gpu_device`` says the model
runs on a GPU (so a server's request seconds count as its GPU seconds).
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
import time
from collections import Counter
from typing import Any, Optional, Sequence

from populations import Candidate, Evaluation, Shape, Status, Template, TemplateError

from .._base import OperatorContext, ParentView, Proposal
from .._model import ModelOperator
from .._knobs import base_knobs, key_of, next_generation, seen_keys, shape_mismatch
from ._bandit import ModelBandit
from ._context import rank_siblings
from ._claims import BatchClaims
from ._grammar import PREFIX
from ._models import ModelSpec, get_backend, resolve_model
from ._parse import Parsed, apply_edits, parse_edits, parse_knob_edit, parse_source
from ._prompts import MODES, render_messages
from ._base import Completion, LLMBackend
from ._transformers import DEFAULT_MODEL

__all__ = ["LLMOperator"]


class LLMOperator(ModelOperator):
    """Mutation (arity 1) or crossover (arity 2) written by a language model."""

    #: the engine runs this operator's proposals on a thread (a call takes seconds)
    asynchronous = True

    def __init__(self, *, name: str = "llm", model: str = DEFAULT_MODEL, models: Sequence[str] = (),
                 model_config: Sequence[str] = (), device: Optional[str] = None, threads: Optional[int] = None,
                 mode: str = "knobs", arity: int = 1, temperature: Sequence[float] = (0.4, 1.0),
                 max_new_tokens: int = 768, max_changes: int = 2, max_attempts: int = 2, inspirations: int = 2,
                 source_chars: int = 6000, knob_source_chars: int = 0, specialize: Optional[bool] = None,
                 concurrency: int = 1, gate: Any = None, gpu_device: bool = False, batch: int = 1) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        if arity not in (1, 2):
            raise ValueError("arity must be 1 (mutation) or 2 (crossover)")
        lo, hi = (float(temperature), float(temperature)) if isinstance(temperature, (int, float)) else map(float, temperature)
        if not 0 <= lo <= hi or max_attempts < 1 or max_changes < 1:
            raise ValueError("temperature must be a range 0 <= lo <= hi; max_attempts and max_changes >= 1")
        names = [models] if isinstance(models, str) else list(models or [model])
        if not names or len(set(names)) != len(names) or not all(isinstance(m, str) and m.strip() for m in names):
            raise ValueError(f"models must be distinct non-empty names, got {names!r}")
        self.name, self.model, self.device, self.mode, self.arity = name, names[0], device, mode, arity
        self.models, self.model_config, self.threads = names, tuple(model_config or ()), threads
        self.concurrency = max(1, int(concurrency))  # proposal calls the engine may run at once (HTTP models)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be an int >= 1, got {batch!r}")
        self.batch = batch  # children the engine asks of one call (knob mode samples them together)
        self._specs: dict[str, ModelSpec] = {}
        self.bandit = ModelBandit(names)
        self._lock = threading.Lock()
        self._cancel = threading.Event()
        self._unclaimed_tokens = 0
        self._unclaimed_gpu_s = 0.0
        self._unclaimed_wait_s = 0.0
        self.gate, self.gpu_device = gate, bool(gpu_device or gate is not None)
        self._pending: dict[str, tuple[str, Optional[float]]] = {}  # child id -> (model name, parent fitness)
        #: per model: proposals, and outcomes of their evaluations (compiled, passed, improved)
        self.outcomes: dict[str, Counter] = {m: Counter() for m in names}
        self.temperature = (lo, hi)
        self.max_new_tokens, self.max_changes, self.max_attempts = max_new_tokens, max_changes, max_attempts
        self.inspirations, self.source_chars, self.knob_source_chars = inspirations, source_chars, knob_source_chars
        self.specialize = specialize

    # -- the prompt -----------------------------------------------------------------------------
    def messages(self, parents: Sequence[ParentView], shape: Shape, context: OperatorContext,
                 template: Optional[Template]) -> list[dict[str, str]]:
        """The chat messages for ``parents`` (what ``evo propose`` and the tests show)."""
        first = parents[0]
        failed = first.evaluation is not None and first.evaluation.status is not Status.OK
        kind = "crossover" if self.arity == 2 and len(parents) > 1 else ("fix" if failed else "mutation")
        siblings = rank_siblings(first, context.at(shape), self.inspirations)
        chars = self.knob_source_chars if self.mode == "knobs" else self.source_chars
        return render_messages(kind, self.mode, parents, shape, template=template, arch=context.arch,
                               inspirations=siblings, max_changes=self.max_changes,
                               source_chars=chars, constraints=self._constraints_wanted())

    def _constraints_wanted(self) -> bool:
        """Whether the prompt lists the knob constraints: not in knob mode when every model of
        this operator is an in-process transformers model, whose decoding loop offers only
        values that keep the set valid (``KnobEditGrammar``); a server or vLLM decodes under a
        JSON schema at most (domains, not constraints) and needs them spelled out."""
        if self.mode != "knobs":
            return True
        try:
            return any(self._spec(m).backend != "transformers" for m in self.models)
        except Exception:  # an unknown model fails later, where it is counted; say too much meanwhile
            return True

    # -- proposing ------------------------------------------------------------------------------
    def _propose(self, parents: tuple[ParentView, ...], shape: Shape, rng: random.Random, n: int,
                 context: OperatorContext) -> list[Proposal]:
        if not parents:
            return [self.failure("the LLM operator needs a parent; none was given")]
        parents = parents[:self.arity]
        if len(parents) == 2 and (parents[0].template != parents[1].template or parents[0].id == parents[1].id):
            # nothing to combine (or knobs of two spaces): mutate the fitter parent instead
            parents = (max(parents, key=lambda p: p.score),)
        parents = tuple(sorted(parents, key=lambda p: -p.score))  # the fitter parent is the one edited
        first = parents[0]
        template = None
        if self.mode == "knobs":
            if not first.template or first.candidate.knobs is None:
                return [self.failure(f"parent {first.id} was not built from a template: no knobs to edit", parents)]
            template = context.template(first.template)
            if template is None:
                return [self.failure(f"parent {first.id}'s template {first.template!r} is not loaded", parents)]
            why = shape_mismatch(template, shape)
            if why:
                return [self.failure(why, parents)]
        else:
            template = context.template(first.template)
        messages = self.messages(parents, shape, context, template)
        specialize = self.specialize if self.specialize is not None else not first.candidate.generic
        seen = seen_keys(context.history)
        if self.mode == "knobs":
            return self._knob_children(messages, parents, template, shape, rng, n, specialize, seen, context)
        known_ids = set(context.known_ids)
        out: list[Proposal] = []
        for _ in range(n):
            reason = ""
            for _attempt in range(self.max_attempts):
                arm, backend, temperature, reason = self._backend(rng)
                if backend is None:
                    continue
                prop, reason = self._source_child(backend, messages, parents, shape, rng, temperature, context,
                                                  known_ids)
                if prop is not None:
                    self._track(prop, arm, parents[0])
                    out.append(prop)
                    break
            else:
                out.append(self.failure(f"no usable answer in {self.max_attempts} attempts; last: {reason}", parents))
        return out

    def _backend(self, rng: random.Random) -> tuple[str, Optional["_Accounted"], float, str]:
        """The model for one call (the bandit's choice), its accounted backend and a temperature;
        a model that cannot load gives no backend, the reason, and a counted empty call."""
        arm = self.bandit.choose(rng)
        try:
            spec = self._spec(arm)
            backend = get_backend(spec)
        except Exception as exc:  # a model that cannot load is a counted failure, never the end of the run
            self.bandit.spend(arm, 0)
            return arm, None, 0.0, f"model {arm} could not load: {type(exc).__name__}: {exc}"
        temperature = rng.uniform(*(spec.temperature or self.temperature))
        return arm, _Accounted(self, arm, backend), temperature, ""

    def _knob_children(self, messages: list[dict[str, str]], parents: tuple[ParentView, ...], template: Template,
                       shape: Shape, rng: random.Random, n: int, specialize: bool, seen: set,
                       context: OperatorContext) -> list[Proposal]:
        """Knob mode: the ``n`` children sampled together, one :meth:`LLMBackend.complete_many`
        call of ``n`` rows (one prompt prefill, one forward pass per step for all rows on the
        in-process model); rows that fail or repeat a knob set (the history's, or another
        row's) are dropped, and up to ``max_attempts`` calls ask again for the missing ones.
        Children still missing then are failures with the last reason."""
        out: list[Proposal] = []
        reason = ""
        for _attempt in range(self.max_attempts):
            need = n - len(out)
            if need <= 0:
                break
            arm, backend, temperature, reason = self._backend(rng)
            if backend is None:
                continue
            props, reason = self._knob_batch(backend, messages, parents, template, shape, rng, temperature,
                                             specialize, seen, context, need)
            for prop in props:
                self._track(prop, arm, parents[0])
            out += props
        why = f"no usable answer in {self.max_attempts} attempts; last: {reason}"
        return out + [self.failure(why, parents) for _ in range(n - len(out))]

    # -- models, accounting and learning ------------------------------------------------------
    def warm(self) -> dict[str, str]:
        """Load every model of this operator and warm it (:meth:`LLMBackend.warm`, under
        :attr:`gate`), before a run starts: loading is no proposal's cost and no arm's luck.
        Per model: ``ready``, or why it could not load (the run goes on; its calls then fail
        at once with that reason). Nothing is charged: no tokens, no GPU seconds."""
        out = {}
        for arm in self.models:
            try:
                get_backend(self._spec(arm)).warm(gate=self.gate)
                out[arm] = "ready"
            except Exception as exc:  # reported, and counted again as each call's failure
                out[arm] = f"could not load: {type(exc).__name__}: {exc}"
        return out

    def _spec(self, name: str) -> ModelSpec:
        spec = self._specs.get(name)
        if spec is None:
            spec = self._specs[name] = resolve_model(name, self.model_config, device=self.device, threads=self.threads)
        return spec

    def _track(self, prop: Proposal, arm: str, parent: ParentView) -> None:
        with self._lock:
            self._pending[prop.candidate.id] = (arm, parent.fitness)
            self.outcomes[arm]["proposed"] += 1

    def _spent(self, arm: str, *completions: Completion) -> None:
        """Count one model call (``completions``: its rows, whose accounting sums to its cost)."""
        tokens = sum(c.prompt_tokens + c.completion_tokens for c in completions)
        gpu_s = sum(c.gpu_s for c in completions)
        wait_s = sum(c.gpu_wait_s for c in completions)
        self.bandit.spend(arm, tokens)
        with self._lock:
            self._unclaimed_tokens += tokens
            self.outcomes[arm]["calls"] += 1
            self.outcomes[arm]["rows"] += len(completions)
            self.outcomes[arm]["tokens"] += tokens
            self._unclaimed_gpu_s += gpu_s
            self._unclaimed_wait_s += wait_s
            self.outcomes[arm]["gpu_s"] += gpu_s  # held: the model's cost
            self.outcomes[arm]["gpu_wait_s"] += wait_s  # waited for the lease: charged to no one
            self.outcomes[arm]["wall_s"] += sum(c.seconds for c in completions)
            self.outcomes[arm]["call_errors"] += sum(bool(c.error) for c in completions)

    def cancel(self) -> None:
        """End running and future model calls of this operator (the engine calls it when a run stops,
        so no generation outlives the run); they come back as failures with reason ``cancelled``."""
        self._cancel.set()

    def take_tokens(self) -> int:
        """Tokens spent since the last call (every model call, failed ones too): the engine's budget."""
        with self._lock:
            tokens, self._unclaimed_tokens = self._unclaimed_tokens, 0
        return tokens

    def take_gpu_seconds(self) -> float:
        """GPU seconds the model *held* since the last call (every call, failed ones too): the
        seconds inside its lease slices, never the seconds it waited for the lease."""
        with self._lock:
            gpu_s, self._unclaimed_gpu_s = self._unclaimed_gpu_s, 0.0
        return gpu_s

    def take_gpu_wait_seconds(self) -> float:
        """Seconds the model waited for the GPU lease since the last call (reported, not charged)."""
        with self._lock:
            wait_s, self._unclaimed_wait_s = self._unclaimed_wait_s, 0.0
        return wait_s

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        """Count the child's outcome for its model; an improvement on its parent rewards the model."""
        with self._lock:
            entry = self._pending.pop(candidate.id, None)
        if entry is None:
            return
        arm, parent_fitness = entry
        fit = evaluation.fitness
        improved = fit is not None and (parent_fitness is None or fit > parent_fitness)
        with self._lock:
            counts = self.outcomes[arm]
            counts["evaluated"] += 1
            counts["compiled"] += evaluation.status not in (Status.COMPILE_ERROR, Status.REJECTED)
            counts["passed"] += evaluation.status is Status.OK
            counts["improved"] += improved
        if improved:
            self.bandit.reward(arm)

    def _meta(self, c: Completion, backend: Any) -> dict[str, Any]:
        """Accounting for the archive: tokens, latency (``seconds``), temperature, and which
        configured model (``model_name``, the bandit's arm) answered."""
        return {"tokens": c.prompt_tokens + c.completion_tokens, "prompt_tokens": c.prompt_tokens,
                "completion_tokens": c.completion_tokens, "seconds": round(c.seconds, 4),
                "gpu_s": round(c.gpu_s, 6), "gpu_wait_s": round(c.gpu_wait_s, 6),
                "temperature": round(c.temperature, 4), "mode": self.mode,
                "model_name": getattr(backend, "arm", self.model)}

    def _knob_batch(self, backend: "_Accounted", messages: list[dict[str, str]], parents: Sequence[ParentView],
                    template: Template, shape: Shape, rng: random.Random, temperature: float, specialize: bool,
                    seen: set, context: OperatorContext, rows: int) -> tuple[list[Proposal], str]:
        """One model call of ``rows`` knob edits: the children among them (new knob sets, each
        once) and the last reason a row gave none."""
        parent_knobs = base_knobs(template, parents[0].candidate.knobs)

        def key(knobs: Any) -> Any:
            return key_of(template.name, knobs, not specialize)

        # sets rows of this call finished on or hold as their way out: the other rows avoid them
        claims = BatchClaims(known=lambda k: key(k) in seen, key=key)
        grammars = claims.grammars(template, parent_knobs, shape, self.max_changes, rows)
        answers = backend.complete_many(messages, rows, rng=rng, temperature=temperature, max_new_tokens=64,
                                        prefix=PREFIX, grammars=grammars)
        out: list[Proposal] = []
        reason = ""
        for c in answers:
            if c.error:
                reason = c.error
                continue
            if not c.finished:
                reason = f"constrained decoding did not finish an edit: {c.text!r}"
                continue
            parsed = parse_knob_edit(c.text, template, parent_knobs, shape)
            if not parsed.ok:
                reason = parsed.reason
                continue
            k = key(parsed.value)
            if k in seen:  # rows that chose their last value in one step can still meet
                reason = "the edit gives a knob set already known"
                with self._lock:
                    self.outcomes[backend.arm]["duplicates"] += 1
                continue
            meta = {**self._meta(c, backend), "batch": rows}
            try:
                cand = template.candidate(parsed.value, shape, specialize, operator=self.name,
                                          parents=tuple(p.id for p in parents),
                                          generation=next_generation(parents, context), model=c.model,
                                          adapter=c.adapter or None, prompt=_transcript(messages), completion=c.text,
                                          meta=meta)
            except (TemplateError, ValueError) as exc:
                reason = f"template {template.name} does not render: {exc}"
                continue
            seen.add(k)
            out.append(Proposal(operator=self.name, candidate=cand, parents=cand.parents))
        return out, reason

    def _source_child(self, backend: Any, messages: list[dict[str, str]], parents: Sequence[ParentView], shape: Shape,
                      rng: random.Random, temperature: float, context: OperatorContext,
                      known_ids: set) -> tuple[Optional[Proposal], str]:
        c = backend.complete(messages, rng=rng, temperature=temperature, max_new_tokens=self.max_new_tokens)
        if c.error:
            return None, c.error
        parent = parents[0].candidate
        parsed: Parsed
        if self.mode == "source":
            parsed = parse_source(c.text)
        else:
            parsed = parse_edits(c.text)
            if parsed.ok:
                parsed = apply_edits(parent.source, parsed.value)
        if not parsed.ok:
            return None, parsed.reason
        try:
            cand = Candidate(source=parsed.value, plan=parent.plan, shapes=(shape,), generic=parent.generic,
                             parents=tuple(p.id for p in parents), operator=self.name, model=c.model,
                             adapter=c.adapter or None,
                             prompt=_transcript(messages), completion=c.text,
                             generation=next_generation(parents, context), meta=self._meta(c, backend))
        except ValueError as exc:
            return None, f"the answer is not a candidate: {exc}"
        if cand.id in known_ids:
            return None, "the answer reproduces a known candidate"
        known_ids.add(cand.id)
        return Proposal(operator=self.name, candidate=cand, parents=cand.parents), ""


def _transcript(messages: list[dict[str, str]]) -> str:
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


class _Accounted:
    """A backend wrapper that reports each completion's tokens to the operator (and the bandit)."""

    def __init__(self, op: LLMOperator, arm: str, backend: LLMBackend) -> None:
        self.op, self.arm, self.backend = op, arm, backend

    def complete(self, *args: Any, **kwargs: Any) -> Completion:
        if self.op._cancel.is_set():
            return Completion("", 0, 0, 0.0, self.arm, kwargs.get("temperature", 0.0), finished=False, error="cancelled")
        if self.backend.steps_under_gate:
            kwargs["cancel"] = self.op._cancel
            kwargs["gate"] = self.op.gate
            c = self.backend.complete(*args, **kwargs)
        else:  # a server or vLLM: the whole request is one slice; its seconds are GPU seconds on a GPU
            gate = self.op.gate
            t0 = time.perf_counter()
            try:
                with (gate.slice(cancel=self.op._cancel) if gate is not None else contextlib.nullcontext()):
                    waited = time.perf_counter() - t0  # before the slice: the lease's wait, not the model's cost
                    c = self.backend.complete(*args, **kwargs)
            except InterruptedError:  # cancelled while waiting for the GPU lease
                return Completion("", 0, 0, 0.0, self.arm, kwargs.get("temperature", 0.0), finished=False,
                                  error="cancelled", gpu_wait_s=time.perf_counter() - t0 if self.op.gpu_device else 0.0)
            if self.op.gpu_device:
                c = dataclasses.replace(c, gpu_s=c.gpu_s or c.seconds, gpu_wait_s=waited)
        self.op._spent(self.arm, c)
        return c

    def complete_many(self, messages: list[dict[str, str]], n: int, **kwargs: Any) -> list[Completion]:
        """``n`` rows of one prompt: one call of a backend that decodes under the gate itself
        (its rows sampled together, accounted as one call), else one request per row, each as
        :meth:`complete` makes it (one gate slice per request, not one for all)."""
        temperature = kwargs.get("temperature", 0.0)
        if self.op._cancel.is_set():
            return [Completion("", 0, 0, 0.0, self.arm, temperature, finished=False, error="cancelled")] * n
        if not self.backend.steps_under_gate:
            grammars = kwargs.pop("grammars", None) or [None] * n
            return [self.complete(messages, grammar=g, **kwargs) for g in grammars]
        kwargs["cancel"] = self.op._cancel
        kwargs["gate"] = self.op.gate
        cs = self.backend.complete_many(messages, n, **kwargs)
        self.op._spent(self.arm, *cs)
        return cs


