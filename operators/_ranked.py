"""The ranking step: many cheap children proposed, a cost model picks the few worth timing.

:class:`RankedOperator` wraps another operator (``inner``: knob mutation by default, or knob
crossover) and a :class:`~._costmodel.CostModel` (``model``: ``tabular`` by default). For each
call it asks ``inner`` for ``proposals`` children (64-256: proposing costs milliseconds on the
CPU, a compile and a timing tenths of a second on the GPU), drops repeats and known ones, asks
the model to score them, and returns the ``n`` best. Children carry the ranker's name as their
operator (so the run's shares and the operator bandit count them apart from plain mutation),
and ``meta`` says how they were chosen: ``ranker`` (the model's name, or ``random``),
``rank_score`` and ``ranked_of`` (how many proposals competed).

The model learns online from every measurement the operator is shown: the shape's history in
each call's context (every operator's children, not only its own) and :meth:`tell`. Until it
has ``min_records`` of them, the choice among proposals is random, so the operator is then
``inner`` with a larger draw. ``archives`` (folders) train it offline first, at its first
call; ``model_file`` starts from a saved model (:meth:`CostModel.save`).

With the ``llm`` cost model (the registry's ``llm_ranked``: :class:`operators.llm.LLMScorer`),
the operator also takes the LLM operators' options (``models``: the first is the scorer's model,
``model_config``, ``device``, ``threads``, which ``evo run --model/--llm-config/--llm-device/
--llm-threads`` hand to every ``llm*`` operator) and exposes ``models``, ``gate`` and ``warm``
as they do, so evo places, gates, warms and switches adapters of the scorer's model like theirs.
"""
from __future__ import annotations

import random
from typing import Any, Mapping, Optional, Sequence, Union

from populations import Archive, Candidate, Evaluation, Shape

from ._base import OperatorContext, ParentView, Proposal
from ._costmodel import CostModel, archive_records, get_cost_model, load_cost_model
from ._model import ModelOperator, model_face

__all__ = ["RankedOperator"]


class RankedOperator(ModelOperator):
    """``inner``'s children, ranked by a cost model (see the module docstring). A model-backed
    operator: it asks for ``batch`` children per call, and a cost model on a GPU (the LLM scorer)
    is warmed and charged through it."""

    def __init__(self, *, name: str = "ranked", inner: str = "knob", model: Union[str, CostModel] = "tabular",
                 proposals: int = 64, min_records: int = 16, batch: int = 4, archives: Sequence[str] = (),
                 model_file: str = "", model_options: Optional[Mapping[str, Any]] = None,
                 models: Sequence[str] = (), model_config: Sequence[str] = (), device: Optional[str] = None,
                 threads: Optional[int] = None) -> None:
        from ._registry import get_operator  # the registry builds this class: import it late

        if isinstance(proposals, bool) or not isinstance(proposals, int) or proposals < 1:
            raise ValueError(f"proposals must be an int >= 1, got {proposals!r}")
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= proposals:
            raise ValueError(f"batch must be an int in [1, proposals], got {batch!r}")
        if min_records < 0:
            raise ValueError(f"min_records must be >= 0, got {min_records!r}")
        self.name, self.proposals, self.min_records, self.batch = name, proposals, min_records, batch
        self.inner = get_operator(inner)
        if model_face(self.inner).asynchronous:
            raise ValueError(f"ranked: inner operator {inner!r} calls a model; rank a cheap operator's children")
        self.arity = self.inner.arity
        llm = {k: v for k, v in (("model", (list(models) or [None])[0]), ("model_config", tuple(model_config or ())),
                                 ("device", device), ("threads", threads)) if v}
        if llm and model != "llm":  # evo run's --model/--llm-device/... reach operators named llm*
            raise ValueError(f"ranked: {', '.join(sorted(llm))} apply to the llm cost model only, not {model!r}")
        if isinstance(model, CostModel):
            self.model = model
        elif model_file:
            self.model = load_cost_model(model_file)
        else:
            self.model = get_cost_model(model, **{**dict(model_options or {}), **llm})
        self._archives = [str(a) for a in archives]
        prompter = getattr(self.model, "prompter", None)
        if prompter is not None:  # an LLM scorer: placed, gated and switched like the LLM operators' models
            self.models = [self.model.model]
            self._spec = prompter._spec
            self.gpu_device = False

    @property
    def gate(self) -> Any:
        """The GPU lease the cost model's GPU work runs under (an LLM scorer on a timing GPU)."""
        return getattr(self.model, "gate", None)

    @gate.setter
    def gate(self, lease: Any) -> None:
        if hasattr(self.model, "gate"):
            self.model.gate = lease

    def warm(self) -> dict[str, str]:
        """Load the cost model's model before the run's clock (an LLM scorer); nothing otherwise."""
        warm = getattr(self.model, "warm", None)
        return warm() if callable(warm) else {}

    def _pretrain(self) -> None:
        """Train on the configured archives once (at the first call: a run's start pays it, not a load)."""
        folders, self._archives = self._archives, []
        for folder in folders:
            with Archive(folder, mode="r") as archive:
                self.model.update(archive_records(archive))

    def _propose(self, parents: tuple[ParentView, ...], shape: Shape, rng: random.Random, n: int,
                 context: OperatorContext) -> list[Proposal]:
        if self._archives:
            self._pretrain()
        self.model.update(context.history)
        drawn = self.inner.propose(parents, shape, rng, max(self.proposals, n), context)
        pool: dict[str, Candidate] = {}
        for p in drawn:
            if p.candidate is not None and p.candidate.id not in context.known_ids:
                pool.setdefault(p.candidate.id, p.candidate)
        if not pool:
            failures = [p for p in drawn if p.candidate is None] or [self.failure("no new child among the proposals",
                                                                                  parents)]
            return [Proposal(operator=self.name, reason=p.reason, parents=p.parents) for p in failures[:n]]
        cands = list(pool.values())
        if self.model.measured < self.min_records:
            chosen = rng.sample(range(len(cands)), min(n, len(cands)))
            scores, how = [None] * len(cands), "random"
        else:
            scores = self.model.predict(shape, cands, parents[0] if parents else None)
            if len(scores) != len(cands):
                raise ValueError(f"cost model {self.model.name} gave {len(scores)} scores for {len(cands)} candidates")
            chosen = sorted(range(len(cands)), key=lambda i: -scores[i])[:n]
            how = self.model.name
        out = []
        for i in chosen:
            meta = {**cands[i].meta, "ranker": how, "ranked_of": len(cands), "inner": self.inner.name}
            if scores[i] is not None:
                meta["rank_score"] = round(float(scores[i]), 6)
            cand = cands[i].derive(operator=self.name, meta=meta)
            out.append(Proposal(operator=self.name, candidate=cand, parents=cand.parents))
        return out

    def take_gpu_seconds(self) -> float:
        """GPU seconds the cost model held since the last call (a model on a GPU, e.g. the LLM
        scorer; 0 for the tabular model, which runs on the CPU)."""
        take = getattr(self.model, "take_gpu_seconds", None)
        return float(take()) if callable(take) else 0.0

    def take_gpu_wait_seconds(self) -> float:
        """Seconds the cost model waited for the GPU lease since the last call (reported only)."""
        take = getattr(self.model, "take_gpu_wait_seconds", None)
        return float(take()) if callable(take) else 0.0

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        """Learn the child's measurement (the model) and pass it on (a stateful inner operator)."""
        self.model.update([(candidate, evaluation)])
        self.inner.tell(candidate, evaluation)
