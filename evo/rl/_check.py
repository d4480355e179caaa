"""The learning check of issue 8: does RL make the operator propose the value that pays?

:func:`synthetic_archive` writes a real archive for one template, parent and shape in which one
knob value is clearly best: every knob set within ``max_changes`` edits of the parent is
recorded with an assigned device-timer speedup (``good`` when it has the value, lower
otherwise, a few compile errors). The fitness values are assigned, not measured: the archive
is the reward source of offline training, so what matters is that the rewards are real archive
records read through the real export and reward path. A handful of the children are recorded as
LLM-made (the operator's real prompt, a JSON edit as completion), half of them with the best
value, so the export has a group whose archived completions include elites (the base model
itself almost never proposes the value: on-policy samples alone would never find it).

:func:`proposal_share` asks the real :class:`operators.llm.LLMOperator` for ``n`` single
proposals (each with its own seeded rng) and returns the share that set the knob to the value.

:func:`choose_target` picks the device check's target from measured one-knob edits: the best
one, only when it is ``margin`` ahead of the runner-up (the first device run's target, SPLIT_K=8,
was a near-tie with SPLIT_K=4 and 16, so a share of one value undersold the update).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from operators import OperatorContext, ParentView
from operators.llm import LLMOperator
from populations import Archive, Candidate, Evaluation, Shape, Status, Template, TimerResult

__all__ = ["synthetic_archive", "proposal_share", "parent_of", "edits", "transcript_of", "measured", "Target",
           "choose_target", "edit_text"]


def transcript_of(messages: Sequence[Mapping[str, str]]) -> str:
    """The operator's transcript format for ``Candidate.prompt`` (inverse of ``messages_of``)."""
    return "\n\n".join(f"[{m['role']}]\n{m['content']}" for m in messages)


def measured(cand: Candidate, shape: Shape, speedup: float) -> Evaluation:
    """An ok evaluation with a device timer giving ``speedup`` (cuBLAS at 10 us)."""
    base = 1e-5
    t = TimerResult(base / speedup, base / speedup, base / speedup, base, base, base, 10)
    return Evaluation(cand.id, shape, Status.OK, timers={"device": t}, arch="sm_90a")


def parent_of(template: Template, shape: Shape,
              knobs: Optional[Mapping[str, Any]] = None) -> tuple[Candidate, Evaluation]:
    """The parent: ``knobs`` (default: the template's first heuristic pick for ``shape``),
    specialised to the shape, measured at 1.0x."""
    cand = template.candidate(dict(knobs) if knobs is not None else template.heuristic(shape)[0], shape, True)
    return cand, measured(cand, shape, 1.0)


def edits(template: Template, parent: Mapping[str, Any], shape: Shape, max_changes: int = 2) -> list[dict[str, Any]]:
    """Every valid knob set within ``max_changes`` edits of ``parent`` (what the grammar can reach)."""
    parent = template.space.complete(parent)
    names = sorted(template.space.knobs)
    out = []
    for k in range(1, max_changes + 1):
        for chosen in itertools.combinations(names, k):
            domains = [[v for v in template.space.knobs[n].values if v != parent[n]] for n in chosen]
            for values in itertools.product(*domains):
                knobs = {**parent, **dict(zip(chosen, values))}
                if not template.check(knobs, shape):
                    out.append(knobs)
    return out


def _unit(*parts: Any) -> float:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:8], "big") / 2**64


def synthetic_archive(path: Union[str, Path], template: Template, shape: Shape, knob: str, value: Any, *,
                      good: float = 1.6, bad: tuple[float, float] = (0.6, 0.95), llm_children: int = 6,
                      max_changes: int = 2, model: str = "SmolLM2-135M-Instruct.Q4_1", seed: int = 0,
                      parent_knobs: Optional[Mapping[str, Any]] = None) -> Path:
    """Write the archive described in the module docstring at ``path`` (a new directory)."""
    parent, pev = parent_of(template, shape, parent_knobs)
    op = LLMOperator()
    ctx = OperatorContext([(parent, pev)], {template.name: template}, arch=90)
    transcript = transcript_of(op.messages([ParentView(parent, pev)], shape, ctx, template))
    sets = edits(template, parent.knobs or {}, shape, max_changes)
    rng = random.Random(seed)
    # the LLM-made children: half of them with the best value (the operator found it now and then,
    # as in a run whose archive has it among its elites), half without
    best = [i for i, k in enumerate(sets) if k[knob] == value]
    rest = [i for i, k in enumerate(sets) if k[knob] != value]
    half = min(llm_children // 2, len(best))
    llm = set(rng.sample(best, half)) | set(rng.sample(rest, min(llm_children - half, len(rest))))
    with Archive(path, mode="w") as archive:
        archive.record(parent, [pev])
        for i, knobs in enumerate(sets):
            changed = {k: v for k, v in knobs.items() if v != parent.knobs[k]}
            extra: dict[str, Any] = {"operator": "knob_mutation"}
            if i in llm:
                extra = {"operator": "llm", "model": model, "prompt": transcript, "completion": json.dumps(changed),
                         "meta": {"mode": "knobs", "tokens": 0}}
            cand = template.candidate(knobs, shape, True, parents=(parent.id,), generation=1, **extra)
            if knobs[knob] == value:
                ev = measured(cand, shape, good * (1 + 0.05 * _unit("g", cand.id)))
            elif _unit("fail", cand.id) < 0.15:
                ev = Evaluation(cand.id, shape, Status.COMPILE_ERROR, message="error: synthetic compile failure")
            else:
                ev = measured(cand, shape, bad[0] + (bad[1] - bad[0]) * _unit("b", cand.id))
            archive.record(cand, [ev])
        archive.commit()
    return Path(path)


def proposal_share(template: Template, shape: Shape, knob: Optional[str], value: Any, *, n: int = 50, seed: int = 0,
                   operator: Optional[LLMOperator] = None, parent_knobs: Optional[Mapping[str, Any]] = None,
                   parent_eval: Optional[Evaluation] = None) -> tuple[float, list[Candidate]]:
    """Share of ``n`` single LLM-operator proposals for the parent that set ``knob`` to ``value``
    (a failed proposal counts as a miss; knob None: 0), and the proposed candidates. The prompt
    shows ``parent_eval`` (a measured one on the device) or an assigned 1.0x."""
    op = operator or LLMOperator()
    parent, pev = parent_of(template, shape, parent_knobs)
    pev = parent_eval or pev
    ctx = OperatorContext([(parent, pev)], {template.name: template}, arch=90)
    hits, cands = 0, []
    for i in range(n):
        props = op.propose([ParentView(parent, pev)], shape, random.Random(seed * 100003 + i), 1, ctx)
        cand = props[0].candidate if props else None
        if cand is not None:
            cands.append(cand)
            hits += knob is not None and (cand.knobs or {}).get(knob) == value
    return hits / n, cands


@dataclass(frozen=True)
class Target:
    """The knob value a device learning check trains towards: the best measured one-knob edit
    of a parent at a shape, ``margin`` (log speedup) ahead of the runner-up edit."""

    shape: Shape
    knob: str
    value: Any
    reward: float
    runner_up: str
    runner_up_reward: float
    parent_reward: float

    @property
    def margin(self) -> float:
        return self.reward - self.runner_up_reward


def edit_text(knobs: Mapping[str, Any], parent: Mapping[str, Any]) -> str:
    """``K=V,...`` of the knobs that differ from the parent's (sorted)."""
    return ",".join(f"{k}={v}" for k, v in sorted(knobs.items()) if parent.get(k) != v)


def choose_target(shape: Shape, parent: Mapping[str, Any], parent_reward: float,
                  sweep: Sequence[tuple[Mapping[str, Any], float]], margin: float) -> tuple[Optional[Target], str]:
    """From measured one-knob edits of ``parent`` (``sweep``: (knob set, reward) pairs) the
    :class:`Target`, when the best edit beats the parent and every other edit by at least
    ``margin``; else None. The second value says why, with the numbers (for the log)."""
    ranked = sorted(((r, edit_text(k, parent), k) for k, r in sweep), key=lambda t: (-t[0], t[1]))
    if len(ranked) < 2:
        return None, f"{shape}: fewer than two measured edits"
    (best, best_edit, knobs), (second, second_edit, _k) = ranked[0], ranked[1]
    changed = [(k, v) for k, v in knobs.items() if parent.get(k) != v]
    if len(changed) != 1:
        raise ValueError(f"the sweep holds {best_edit!r}, not a one-knob edit of the parent")
    why = (f"{shape}: best {best_edit} {best:+.3f}, runner-up {second_edit} {second:+.3f} "
           f"(margin {best - second:+.3f}, needed {margin:+.3f}), parent {parent_reward:+.3f}")
    if best - second < margin or best - parent_reward < margin:
        return None, why
    (knob, value), = changed
    return Target(shape, knob, value, best, second_edit, second, parent_reward), why
