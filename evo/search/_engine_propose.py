"""The engine's proposing half: where a shape's next candidate comes from.

Queued candidates first (transferred elites, seeds, archived ones not yet evaluated), then the
operators in the order the chooser drew: parents are selected from the shape's population,
synchronous operators propose on the loop's thread, asynchronous ones (the LLM operators) on a
thread of their own whose answers join the shape's queue. Proposals are checked (a candidate,
for this shape), their tokens and model GPU seconds charged. A mixin of :class:`evo.search._engine.Engine`,
whose state it shares (see that module's docstring for the loop).
"""
from __future__ import annotations

import random
import threading
from collections import Counter, deque
from concurrent.futures import Future, wait
from typing import Any, Optional

from populations import Candidate, Evaluation, Shape
from operators import Operator, OperatorContext, ParentView, model_face, model_usage

from ._budget import Budget
from ._config import RunConfig
from ._opbandit import OperatorBandit, OperatorChooser
from ._selection import Population

__all__ = ["Proposing"]


class Proposing:
    """Proposal methods of the engine (its state is set up by ``Engine.__init__``)."""

    #: Seconds a stopping run waits for cancelled asynchronous proposals to return.
    PROPOSAL_GRACE_S = 15.0

    config: RunConfig
    rng: random.Random
    arch: str
    budget: Budget
    chooser: "OperatorChooser | OperatorBandit"
    operators: dict[str, Operator]
    templates: dict[str, Any]
    populations: dict[Shape, Population]
    queue: dict[Shape, deque[tuple[Candidate, str]]]
    known: dict[Shape, set[str]]
    history: dict[Shape, list[tuple[Candidate, Evaluation]]]
    proposing: dict[Future, tuple[str, Shape]]
    switched_off: set[str]
    token_spenders: set[str]
    failures: Counter
    duplicates: int

    def _next(self, shape: Shape) -> Optional[tuple[Candidate, str]]:
        """The next candidate for ``shape``: queued ones first, then an operator's proposals."""
        q = self.queue[shape]
        while q:
            cand, op = q.popleft()
            if cand.id not in self.known[shape]:
                return cand, op
            self.duplicates += 1
        for name in self.chooser.order(self.rng):
            op = self.operators[name]
            if name in self.switched_off:
                continue
            if op.arity > 0 and not len(self.populations[shape]):
                continue  # nothing to mutate yet (seeds still in flight, or all failed)
            if model_face(op).asynchronous:
                self._propose_async(name, shape)  # its answer joins the queue later
                continue
            context = OperatorContext(history=self.history[shape], templates=self.templates, arch=self.arch)
            proposals = self._accept(name, shape, op.propose(self._parents(op, shape), shape, self.rng,
                                                             max(self.config.batch, model_face(op).batch), context))
            fresh = [c for c in proposals if c.id not in self.known[shape]]
            self.duplicates += len(proposals) - len(fresh)
            if fresh:
                q.extend((c, name) for c in fresh[1:])
                return fresh[0], name
        return None

    def _propose_async(self, name: str, shape: Shape) -> None:
        """Start ``name`` proposing for ``shape`` on a thread, unless the operator already
        has ``concurrency`` calls running or one for this shape."""
        op = self.operators[name]
        running = [s for n, s in self.proposing.values() if n == name]
        if shape in running or len(running) >= max(1, int(model_face(op).concurrency or 1)):
            return
        context = OperatorContext(history=self.history[shape], templates=self.templates, arch=self.arch)
        parents = self._parents(op, shape)
        rng = random.Random(self.rng.getrandbits(64))
        fut: Future = Future()
        fut.set_running_or_notify_cancel()

        def work() -> None:
            try:
                fut.set_result(op.propose(parents, shape, rng, max(self.config.batch, model_face(op).batch), context))
            except BaseException as exc:  # propose() turns operator errors into failures; this is a bad call
                fut.set_exception(exc)

        self.proposing[fut] = (name, shape)
        # not a daemon: the interpreter waits for it at exit rather than kill it inside torch (which
        # aborts the process); a stopping run cancels it first (_stop_proposals)
        threading.Thread(target=work, name=f"evo-propose-{name}", daemon=False).start()

    def _stop_proposals(self) -> None:
        """Cancel running asynchronous proposals (operators with ``cancel()``) and wait briefly for
        their threads, so no model call outlives the run (a torch call in a daemon thread at
        interpreter exit aborts the process)."""
        if not self.proposing:
            return
        for name in {n for n, _ in self.proposing.values()}:
            model_face(self.operators[name]).cancel()
        wait(list(self.proposing), timeout=self.PROPOSAL_GRACE_S)
        self.proposing.clear()

    def _collect_proposals(self, done: set[Future]) -> None:
        """Queue the children of finished asynchronous proposals (their failures are counted)."""
        for fut in done:
            name, shape = self.proposing.pop(fut)
            try:
                proposals = fut.result()
            except Exception as exc:
                self.failures[(name, f"operator error: {type(exc).__name__}")] += 1
                continue
            accepted = self._accept(name, shape, proposals)
            fresh = [c for c in accepted if c.id not in self.known[shape]]
            self.duplicates += len(accepted) - len(fresh)
            self.queue[shape].extend((c, name) for c in fresh)

    def _parents(self, op: Operator, shape: Shape) -> list[ParentView]:
        sel = self.config.selection
        arity = op.arity
        members = self.populations[shape].select(self.rng, arity, sel.method, tournament_size=sel.tournament_size,
                                          alpha=sel.power_alpha) if arity > 0 else []
        return [ParentView(m.candidate, m.evaluation) for m in members]

    def _accept(self, name: str, shape: Shape, proposals: list[Any]) -> list[Candidate]:
        """The candidates among operator ``name``'s proposals; failures are counted, not fatal, and
        tokens charged (all the operator spent, failed calls included, where it can say)."""
        op = self.operators[name]
        usage = model_usage(op)
        counted = usage.tokens
        tokens = counted if counted is not None else sum(int(p.candidate.meta.get("tokens", 0) or 0)
                                                         for p in proposals if p.candidate is not None)
        if tokens > 0:
            self.token_spenders.add(name)
            self.budget.charge_tokens(tokens)
        self.budget.note_llm_wait(usage.gpu_wait_s)  # reported, charged to no one
        llm_gpu_s = usage.gpu_s  # held seconds only (issue 35)
        if llm_gpu_s > 0:  # the model ran on a GPU: GPU budget, and its operator's cost
            self.budget.charge_gpu(llm_gpu_s)
            if isinstance(self.chooser, OperatorBandit):
                versions = [p.candidate.adapter or "" for p in proposals if p.candidate is not None]
                self.chooser.charge(name, llm_gpu_s, versions[-1] if versions else None)
        out = []
        for p in proposals:
            cand = p.candidate
            if cand is None:
                self.failures[(name, p.reason.split(":")[0][:60])] += 1
                continue
            if shape not in cand.shapes:
                self.failures[(name, "proposed for another shape")] += 1
                continue
            out.append(cand)
        return out

