"""The engine's proposing half: where a shape's next candidate comes from.

Queued candidates first (transferred elites, seeds, archived ones not yet evaluated), then the
operators in the order the chooser drew: parents are selected from the shape's population,
synchronous operators propose on the loop's thread, asynchronous ones (the LLM operators) on a
thread of their own whose answers join the shape's queue. Proposals are checked (a candidate,
for this shape), their tokens and model GPU seconds charged. The :class:`Proposer` is a
collaborator of :class:`evo.search._engine.Engine`: it is handed the run's services and acts on
the :class:`ShapeState` it is given; its own state is the proposals running on threads and the
counts of duplicates and failures (see the engine's module docstring for the loop).
"""
from __future__ import annotations

import random
import threading
from collections import Counter
from concurrent.futures import Future, wait
from typing import Any, Optional

from populations import Candidate
from operators import Operator, OperatorContext, ParentView, model_face, model_usage

from ._services import EngineServices
from ._shape_state import ShapeState

__all__ = ["Proposer"]


class Proposer:
    """See the module docstring."""

    #: Seconds a stopping run waits for cancelled asynchronous proposals to return.
    PROPOSAL_GRACE_S = 15.0

    def __init__(self, services: EngineServices) -> None:
        self.services = services
        self.running: dict[Future, tuple[str, ShapeState]] = {}  # asynchronous proposals running
        self.duplicates = 0
        self.failures: Counter = Counter()  # (operator, reason) of proposals that came back empty
        self.token_spenders: set[str] = set()  # operators that reported tokens
        self.switched_off: set[str] = set()  # operators the token budget stopped

    def tokens_spent(self) -> Optional[str]:
        """The token budget is reached: switch off the operators that spend tokens (once); the run
        goes on with the others, or stops (``tokens``) when none is left."""
        s = self.services
        stop = self.token_spenders - self.switched_off
        if stop:
            self.switched_off |= stop
            s.events.emit("operators_stopped", None, budget="tokens", operators=sorted(stop), used=s.budget.summary())
            s.progress.message(f"evo: token budget reached; no more proposals from {', '.join(sorted(stop))}")
        return None if set(s.operators) - self.switched_off else "tokens"

    def next(self, state: ShapeState) -> Optional[tuple[Candidate, str]]:
        """The next candidate for ``state``'s shape: queued ones first, then an operator's proposals."""
        s = self.services
        q = state.queue
        while q:
            cand, op = q.popleft()
            if cand.id not in state.known:
                return cand, op
            self.duplicates += 1
        for name in s.chooser.order(s.rng):
            op = s.operators[name]
            if name in self.switched_off:
                continue
            if op.arity > 0 and not len(state.population):
                continue  # nothing to mutate yet (seeds still in flight, or all failed)
            if model_face(op).asynchronous:
                self._propose_async(name, state)  # its answer joins the queue later
                continue
            context = OperatorContext(history=state.history, templates=s.templates, arch=s.arch)
            proposals = self._accept(name, state, op.propose(self._parents(op, state), state.shape, s.rng,
                                                             max(s.config.batch, model_face(op).batch), context))
            fresh = [c for c in proposals if c.id not in state.known]
            self.duplicates += len(proposals) - len(fresh)
            if fresh:
                q.extend((c, name) for c in fresh[1:])
                return fresh[0], name
        return None

    def _propose_async(self, name: str, state: ShapeState) -> None:
        """Start ``name`` proposing for ``state``'s shape on a thread, unless the operator already
        has ``concurrency`` calls running or one for this shape."""
        s = self.services
        op = s.operators[name]
        running = [st for n, st in self.running.values() if n == name]
        if state in running or len(running) >= max(1, int(model_face(op).concurrency or 1)):
            return
        context = OperatorContext(history=state.history, templates=s.templates, arch=s.arch)
        parents = self._parents(op, state)
        rng = random.Random(s.rng.getrandbits(64))
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        shape = state.shape

        def work() -> None:
            try:
                fut.set_result(op.propose(parents, shape, rng, max(s.config.batch, model_face(op).batch), context))
            except BaseException as exc:  # propose() turns operator errors into failures; this is a bad call
                fut.set_exception(exc)

        self.running[fut] = (name, state)
        # not a daemon: the interpreter waits for it at exit rather than kill it inside torch (which
        # aborts the process); a stopping run cancels it first (stop)
        threading.Thread(target=work, name=f"evo-propose-{name}", daemon=False).start()

    def stop(self) -> None:
        """Cancel running asynchronous proposals (operators with ``cancel()``) and wait briefly for
        their threads, so no model call outlives the run (a torch call in a daemon thread at
        interpreter exit aborts the process)."""
        if not self.running:
            return
        for name in {n for n, _ in self.running.values()}:
            model_face(self.services.operators[name]).cancel()
        wait(list(self.running), timeout=self.PROPOSAL_GRACE_S)
        self.running.clear()

    def collect(self, done: set[Future]) -> None:
        """Queue the children of finished asynchronous proposals (their failures are counted)."""
        for fut in done:
            name, state = self.running.pop(fut)
            try:
                proposals = fut.result()
            except Exception as exc:
                self.failures[(name, f"operator error: {type(exc).__name__}")] += 1
                continue
            accepted = self._accept(name, state, proposals)
            fresh = [c for c in accepted if c.id not in state.known]
            self.duplicates += len(accepted) - len(fresh)
            state.queue.extend((c, name) for c in fresh)

    def _parents(self, op: Operator, state: ShapeState) -> list[ParentView]:
        sel = self.services.config.selection
        arity = op.arity
        members = state.population.select(self.services.rng, arity, sel.method, tournament_size=sel.tournament_size,
                                          alpha=sel.power_alpha) if arity > 0 else []
        return [ParentView(m.candidate, m.evaluation) for m in members]

    def _accept(self, name: str, state: ShapeState, proposals: list[Any]) -> list[Candidate]:
        """The candidates among operator ``name``'s proposals; failures are counted, not fatal, and
        tokens charged (all the operator spent, failed calls included, where it can say)."""
        s = self.services
        op = s.operators[name]
        usage = model_usage(op)
        counted = usage.tokens
        tokens = counted if counted is not None else sum(int(p.candidate.meta.get("tokens", 0) or 0)
                                                         for p in proposals if p.candidate is not None)
        if tokens > 0:
            self.token_spenders.add(name)
            s.budget.charge_tokens(tokens)
        s.budget.note_llm_wait(usage.gpu_wait_s)  # reported, charged to no one
        llm_gpu_s = usage.gpu_s  # held seconds only (issue 35)
        if llm_gpu_s > 0:  # the model ran on a GPU: GPU budget, and its operator's cost
            s.budget.charge_gpu(llm_gpu_s)
            versions = [p.candidate.adapter or "" for p in proposals if p.candidate is not None]
            s.chooser.charge(name, llm_gpu_s, versions[-1] if versions else None)
        out = []
        for p in proposals:
            cand = p.candidate
            if cand is None:
                self.failures[(name, p.reason.split(":")[0][:60])] += 1
                continue
            if state.shape not in cand.shapes:
                self.failures[(name, "proposed for another shape")] += 1
                continue
            out.append(cand)
        return out

