"""Optuna samplers (TPE, CMA-ES) over a template's knob space, driven by ask/tell.

One in-memory study per (template, shape). Integer knobs with more than one value become an
``IntDistribution`` over the index in sorted order (so TPE and CMA-ES see 64 between 32 and 128),
bools and strings a ``CategoricalDistribution``. The study is warm-started from the shape's
history with ``study.add_trial(create_trial(...))``; proposed trials stay pending until their
result arrives through :meth:`OptunaOperator.tell` or appears in a later call's history.

The objective is maximised: ``log(speedup)``, floored at ``log(FLOOR_SPEEDUP)``; every failure
(compile error, incorrect, flagged, ...) and every knob set the template's constraints refuse
is told ``PENALTY``, below any valid value, so the sampler learns to avoid those regions.

Optuna is optional (the ``optuna`` extra): it is imported only when an operator is built.
"""
from __future__ import annotations

import math
import random
import warnings
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Optional

from populations import Candidate, Evaluation, Shape, Template

from ._base import Operator, OperatorContext, ParentView, Proposal
from ._knobs import base_knobs, choose_template, domain, neighbour, next_generation, pick_knobs, repair, shape_mismatch

__all__ = ["OptunaOperator", "PENALTY", "FLOOR_SPEEDUP", "objective", "import_optuna"]

#: Speedups below this count as this (a 1000x slower kernel is as useless as a failure, almost).
FLOOR_SPEEDUP = 1e-3
#: What failures and invalid knob sets are told: below every valid value.
PENALTY = math.log(FLOOR_SPEEDUP) - 1.0
SAMPLERS = ("tpe", "cmaes")
#: Random knob sets tried before a space counts as exhausted (after the neighbours of a repeat).
RANDOM_TRIES = 256
#: Valid history points needed before CMA-ES starts from them (its warm start keeps the top tenth).
WARM_START_MIN = 10


def import_optuna(sampler: str = "tpe") -> Any:
    """Import optuna (and cmaes for CMA-ES) or raise an ImportError that names the extra to install."""
    try:
        import optuna
    except ImportError as exc:
        raise ImportError("the Optuna operators need optuna: install the extra with "
                          "`pip install 'evo-hgemm[optuna]'` (or `pip install optuna`)") from exc
    if sampler == "cmaes":
        try:
            import cmaes  # noqa: F401
        except ImportError as exc:
            raise ImportError("the CMA-ES operator needs the cmaes package: install the extra with "
                              "`pip install 'evo-hgemm[optuna]'` (or `pip install cmaes`)") from exc
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per trial would drown the engine's log
    return optuna


def objective(evaluation: Optional[Evaluation]) -> float:
    """The value a study is told: log(speedup) floored, or PENALTY for anything without a fitness."""
    fit = evaluation.fitness if evaluation is not None else None
    if fit is None or not fit > 0 or math.isnan(fit):
        return PENALTY
    return max(math.log(fit), math.log(FLOOR_SPEEDUP))


def _kkey(knobs: dict[str, Any]) -> tuple:
    return tuple(sorted((k, repr(v)) for k, v in knobs.items()))


@dataclass
class _Study:
    """One study and the bookkeeping that ties its trials to candidates."""

    study: Any
    distributions: dict[str, Any]
    fixed: dict[str, Any]
    source: Optional[list] = None                               # CMA-ES warm-start trials
    pending: dict[str, int] = field(default_factory=dict)      # candidate id -> trial number
    pending_keys: dict[str, tuple] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)                # candidate ids already told
    values: dict[tuple, float] = field(default_factory=dict)   # knob key -> value told


class OptunaOperator(Operator):
    """TPE or CMA-ES proposals for one template at one shape (arity 0: history is the input)."""

    arity = 0

    def __init__(self, *, sampler: str = "tpe", name: Optional[str] = None, template: Optional[str] = None,
                 n_startup_trials: int = 10, max_attempts: int = 40, specialize: bool = False,
                 max_pending: int = 1024, sampler_options: Optional[dict[str, Any]] = None) -> None:
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}")
        self._optuna = import_optuna(sampler)
        self.sampler = sampler
        self.name = name or sampler
        self.template = template
        self.startup = n_startup_trials
        self.max_attempts = max_attempts
        self.specialize = specialize
        self.max_pending = max_pending
        self.sampler_options = dict(sampler_options or {})
        self._studies: dict[tuple[str, Shape], _Study] = {}
        self._templates: dict[str, Template] = {}
        self.tell_errors: Counter[str] = Counter()  # results tell() could not hand to a study, by message

    # -- the study ---------------------------------------------------------------------------
    def _make_sampler(self, seed: int, source: Optional[list]) -> Any:
        samplers = self._optuna.samplers
        opts = dict(self.sampler_options)
        opts.setdefault("n_startup_trials", self.startup)
        if self.sampler == "tpe":
            return samplers.TPESampler(seed=seed, **opts)
        if source:
            opts.setdefault("source_trials", source)
        opts.setdefault("warn_independent_sampling", False)  # categorical knobs go to the random sampler
        return samplers.CmaEsSampler(seed=seed, **opts)

    def _state(self, template: Template, shape: Shape, rng: random.Random, history: list) -> _Study:
        key = (template.name, shape)
        state = self._studies.get(key)
        if state is not None:
            return state
        dist = self._optuna.distributions
        distributions: dict[str, Any] = {}
        fixed: dict[str, Any] = {}
        for name, knob in template.space.knobs.items():
            values = domain(knob)
            if len(values) == 1:
                fixed[name] = values[0]
            elif knob.kind == "int":
                distributions[name] = dist.IntDistribution(0, len(values) - 1)
            else:
                distributions[name] = dist.CategoricalDistribution(values)
        source = self._source_trials(template, distributions, history) if self.sampler == "cmaes" else None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", self._optuna.exceptions.ExperimentalWarning)
            study = self._optuna.create_study(direction="maximize",
                                              sampler=self._make_sampler(rng.getrandbits(31), source))
        state = _Study(study, distributions, fixed, source)
        self._studies[key] = state
        return state

    def _source_trials(self, template: Template, distributions: dict[str, Any], history: list) -> Optional[list]:
        """WS-CMA-ES warm start: the history's valid points over the integer knobs (CMA-ES's search
        space; categorical knobs go to its independent sampler). None below ``WARM_START_MIN`` points."""
        ints = {k: d for k, d in distributions.items() if isinstance(d, self._optuna.distributions.IntDistribution)}
        out = []
        for cand, ev in history:
            params = self._params(template, cand.knobs, distributions)
            if params is None or not ints or objective(ev) <= PENALTY:
                continue
            out.append(self._optuna.trial.create_trial(params={k: params[k] for k in ints}, distributions=ints,
                                                       value=objective(ev)))
        return out if len(out) >= WARM_START_MIN else None

    def _params(self, template: Template, knobs: Any, distributions: dict[str, Any]) -> Optional[dict[str, Any]]:
        """Knobs -> trial params (indices for ints); None when a knob is outside today's domain."""
        full = base_knobs(template, knobs)
        if knobs is None or any(k in template.space.knobs and full[k] != v for k, v in knobs.items()):
            return None
        params = {}
        for name, d in distributions.items():
            values = domain(template.space.knobs[name])
            params[name] = values.index(full[name]) if template.space.knobs[name].kind == "int" else full[name]
        return params

    def _knobs(self, template: Template, state: _Study, params: dict[str, Any]) -> dict[str, Any]:
        knobs = dict(state.fixed)
        for name, value in params.items():
            knob = template.space.knobs[name]
            knobs[name] = domain(knob)[int(value)] if knob.kind == "int" else value
        return knobs

    def _observe(self, template: Template, state: _Study, cand: Candidate, ev: Evaluation) -> None:
        if cand.id in state.done:
            return
        value = objective(ev)
        state.done.add(cand.id)
        number = state.pending.pop(cand.id, None)
        key = state.pending_keys.pop(cand.id, None)
        if number is not None:
            state.study.tell(number, value)
        else:
            params = self._params(template, cand.knobs, state.distributions)
            if params is None:
                return
            key = _kkey(self._knobs(template, state, params))
            state.study.add_trial(self._optuna.trial.create_trial(
                params=params, distributions=state.distributions, value=value, user_attrs={"candidate": cand.id}))
        state.values[key] = max(value, state.values.get(key, PENALTY))

    def study(self, template: str, shape: Shape) -> Any:
        """The optuna study of ``template`` at ``shape`` (None before the first proposal there), for reports."""
        state = self._studies.get((template, shape))
        return state.study if state is not None else None

    def tell(self, candidate: Candidate, evaluation: Evaluation) -> None:
        """Tell the study the outcome of a candidate (ours or another operator's) at its shape."""
        state = self._studies.get((candidate.template or "", evaluation.shape))
        if state is None:  # studies exist only for templates seen by propose
            return
        try:
            self._observe(self._templates[candidate.template or ""], state, candidate, evaluation)
        except Exception as exc:  # a result the study cannot take must not stop the engine
            self.tell_errors[f"{type(exc).__name__}: {exc}"[:200]] += 1

    # -- proposing ---------------------------------------------------------------------------
    def _propose(self, parents: tuple[ParentView, ...], shape: Shape, rng: random.Random, n: int,
                 context: OperatorContext) -> list[Proposal]:
        template, why = choose_template(parents, shape, rng, context, self.template)
        if template is None:
            return [self.failure(why)]
        why = shape_mismatch(template, shape)
        if why:
            return [self.failure(why)]
        self._templates[template.name] = template
        history = [(c, e) for c, e in context.at(shape) if c.template == template.name]
        state = self._state(template, shape, rng, history)
        for cand, ev in history:
            self._observe(template, state, cand, ev)
        self._expire(state)
        # a fresh seed per call: the output depends on the rng handed in, not on hidden state
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", self._optuna.exceptions.ExperimentalWarning)
            state.study.sampler = self._make_sampler(rng.getrandbits(31), state.source)
        return self._ask(template, state, shape, rng, n, context)

    def _ask(self, template: Template, state: _Study, shape: Shape, rng: random.Random, n: int,
             context: OperatorContext) -> list[Proposal]:
        """Ask until ``n`` new valid knob sets. An invalid ask is told PENALTY and its repair is
        enqueued; an ask that repeats a known knob set (a converging sampler does that often) is
        nudged: one knob steps to a neighbouring value and that unseen set is enqueued."""
        trial_state = self._optuna.trial.TrialState
        generation = next_generation((), context)
        taken = set(state.values) | set(state.pending_keys.values())
        out: list[Proposal] = []
        invalid = duplicates = 0
        last = ""
        exhausted = False
        self._enqueue_startup(template, state, shape, rng, n)
        asks = 0
        while len(out) < n and asks < self.max_attempts * n:
            asks += 1
            trial = state.study.ask(state.distributions)
            knobs = self._knobs(template, state, trial.params)
            reasons = template.check(knobs, shape)
            if reasons:
                state.study.tell(trial, PENALTY)  # the sampler learns where the constraints bite
                invalid += 1
                last = "; ".join(reasons)
                self._enqueue(template, state, repair(template, knobs, shape, rng, budget=3), "repair")
                continue
            key = _kkey(knobs)
            if key in taken:
                duplicates += 1
                if self.sampler == "cmaes" and key in state.values:
                    state.study.tell(trial, state.values[key])  # CMA-ES needs a value for every sample
                else:
                    state.study.tell(trial, state=trial_state.FAIL)  # nothing new: tell TPE nothing
                nearby = self._nearby(template, knobs, shape, rng, taken)
                if nearby is None:
                    exhausted = True
                    break  # the space is (all but) exhausted: more asks would only repeat
                self._enqueue(template, state, nearby, "nudge")
                continue
            proposal = self.build(template, knobs, shape, (), specialize=self.specialize, generation=generation,
                                  meta={"sampler": self.sampler, "trial": trial.number,
                                        "origin": trial.user_attrs.get("origin", self.sampler)})
            if not proposal.ok:
                state.study.tell(trial, PENALTY)
                invalid += 1
                last = proposal.reason
                continue
            taken.add(key)
            state.pending[proposal.candidate.id] = trial.number
            state.pending_keys[proposal.candidate.id] = key
            out.append(proposal)
        if len(out) < n:
            reason = (f"{self.sampler} found {len(out)} of {n} new valid knob sets of {template.name} at {shape} "
                      f"in {asks} asks ({invalid} invalid, {duplicates} already known)"
                      + (f"; no unseen valid knob set near its picks nor in {RANDOM_TRIES} random draws: "
                         "the space looks exhausted" if exhausted else "")
                      + (f"; last violation: {last}" if last else ""))
            out += [self.failure(reason)] * (n - len(out))
        return out

    def _enqueue(self, template: Template, state: _Study, knobs: Optional[dict[str, Any]], origin: str) -> None:
        """Make ``knobs`` the next ask (a repaired or nudged point), marked with where it came from."""
        if knobs is not None:
            state.study.enqueue_trial(self._params(template, knobs, state.distributions), user_attrs={"origin": origin})

    def _nearby(self, template: Template, knobs: dict[str, Any], shape: Shape, rng: random.Random,
                taken: set[tuple], tries: int = 24) -> Optional[dict[str, Any]]:
        """A valid knob set not in ``taken`` one knob step from ``knobs``, else a random unseen valid
        one (so a nearly exhausted space still gets finished), else None."""
        names = [k for k in template.space.knobs if len(template.space.knobs[k].values) > 1]
        for _ in range(tries if names else 0):
            [name] = pick_knobs(template, names, 1, rng)
            child = dict(knobs)
            child[name] = neighbour(template.space.knobs[name], knobs[name], rng)
            if _kkey(child) not in taken and not template.check(child, shape):
                return child
        for _ in range(RANDOM_TRIES):
            other = template.space.random(rng)
            if _kkey(other) not in taken and not template.check(other, shape):
                return other
        return None

    def _enqueue_startup(self, template: Template, state: _Study, shape: Shape, rng: random.Random, n: int) -> None:
        """Until ``n_startup_trials`` valid points are known or pending, the samplers draw at random;
        draw those among *valid* knob sets, so a constrained space does not waste the start."""
        known = sum(1 for v in state.values.values() if v > PENALTY) + len(state.pending)
        want = min(n, self.startup - known)
        if want <= 0:
            return
        taken = set(state.values) | set(state.pending_keys.values())
        for knobs in template.sample(rng, shape, want + min(len(taken), 4 * want + 64)):
            full = template.space.complete(knobs)
            if _kkey(full) in taken:
                continue
            self._enqueue(template, state, full, "startup")
            taken.add(_kkey(full))
            want -= 1
            if want == 0:
                break

    def _expire(self, state: _Study) -> None:
        """Fail the oldest pending trials beyond ``max_pending`` (results that never came back)."""
        while len(state.pending) > self.max_pending:
            cid = next(iter(state.pending))
            state.study.tell(state.pending.pop(cid), state=self._optuna.trial.TrialState.FAIL)
            state.pending_keys.pop(cid, None)
