"""Every measured parent-child pair of an archive, as a labelled example for the LLM (issue 35).

``evo rl export`` writes the LLM's own children only; every child of every operator (knob
mutation, crossover, the ranker, the LLM) with its parent and its measured outcome is a
labelled example of "this edit of this parent at this shape gained this much". A row here:

- ``prompt``: the chat the LLM operator (knob mode, mutation) would have shown for the child's
  first parent at the child's shape, rebuilt from the history *as it was when the child was
  created*: only evaluations finished before the child's ``created`` time (the parent's
  included), so no sibling measured later (nor the child itself) leaks into it;
- ``completion``: the child's knob edit as the model writes it (a JSON object of the knobs that
  differ from the parent's: what the knob grammar decodes, its prefix included);
- ``gain``: the child's fitness over the parent's at that shape (0 for a failed child),
  ``log_gain`` (None for a failed child) and ``reward`` = max(0, log_gain) (the operator
  bandit's gain; 0 for a failure);
- provenance: ``operator``, ``shape``, ``candidate``, ``parent``, ``template``, ``knobs``,
  ``parent_knobs``, ``status``, ``created`` and ``history`` (how many records the prompt saw).

Pairs need a template child of a template parent measured at the shape before the child
existed; the others are counted, by reason, in :func:`export_pairs`'s second value.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Iterable, Optional

from operators import OperatorContext, ParentView
from operators.llm import LLMOperator
from populations import Archive, Candidate, Evaluation, Template, load_templates

from ._dataset import shape_records

__all__ = ["export_pairs", "edit_completion"]


def edit_completion(knobs: dict[str, Any], parent: dict[str, Any]) -> str:
    """The knob edit as the LLM writes it: a JSON object of the knobs that differ from ``parent``."""
    return json.dumps({k: v for k, v in sorted(knobs.items()) if parent.get(k) != v})


def export_pairs(archives: Iterable[Archive], *, templates: Optional[dict[str, Template]] = None,
                 since: float = 0.0, arch: str = "sm_90a") -> tuple[list[dict[str, Any]], Counter]:
    """Rows for every measured parent-child pair of every operator (see the module docstring),
    children created at or after ``since``, sorted by creation time; and the count, by reason,
    of evaluated children left out."""
    templates = dict(templates) if templates is not None else load_templates(errors="warn")
    prompter = LLMOperator()  # builds prompts only: no model is loaded
    rows: list[dict[str, Any]] = []
    skipped: Counter = Counter()
    for archive in archives:
        for shape in archive.shapes():
            cands, evals = shape_records(archive, shape)
            finished = sorted(((ev.created, cands[cid], ev) for cid, evs in evals.items() if cid in cands
                               for ev in evs), key=lambda t: t[0])
            for child in sorted(cands.values(), key=lambda c: c.created):
                if child.id not in evals or child.created < since:
                    continue
                row, why = _pair(prompter, child, evals[child.id][-1], cands, evals, finished, shape,
                                 templates, arch)
                if row is None:
                    skipped[why] += 1
                else:
                    rows.append(row)
    rows.sort(key=lambda r: r["created"])
    return rows, skipped


def _pair(prompter: LLMOperator, child: Candidate, child_ev: Evaluation, cands: dict[str, Candidate],
          evals: dict[str, list[Evaluation]], finished: list[tuple[float, Candidate, Evaluation]], shape: Any,
          templates: dict[str, Template], arch: str) -> tuple[Optional[dict[str, Any]], str]:
    """One pair's row, or None and why not."""
    if not child.parents:
        return None, "no parent (a seed, a transfer or a sampler's child)"
    parent = cands.get(child.parents[0])
    if parent is None or parent.knobs is None or child.knobs is None or not child.template:
        return None, "not a template child of a template parent at this shape"
    template = templates.get(child.template)
    if template is None or parent.template != child.template:
        return None, "template not loaded, or the parent's is another"
    before = [(c, e) for t, c, e in finished if t < child.created]  # the history when the child was made
    parent_evs = [e for c, e in before if c.id == parent.id]
    if not parent_evs or parent_evs[-1].fitness is None:
        return None, "the parent had no valid measurement at this shape before the child"
    parent_ev = parent_evs[-1]
    context = OperatorContext(history=before, templates={template.name: template}, arch=arch)
    messages = prompter.messages([ParentView(parent, parent_ev)], shape, context, context.template(template.name))
    fit, pfit = child_ev.fitness, parent_ev.fitness
    log_gain = math.log(fit / pfit) if fit is not None and fit > 0 else None
    return {
        "prompt": messages,
        "completion": [{"role": "assistant", "content": edit_completion(dict(child.knobs), dict(parent.knobs))}],
        "gain": fit / pfit if log_gain is not None else 0.0, "log_gain": log_gain,
        "reward": max(0.0, log_gain) if log_gain is not None else 0.0,
        "operator": child.operator, "shape": str(shape), "candidate": child.id, "parent": parent.id,
        "template": child.template, "knobs": dict(child.knobs), "parent_knobs": dict(parent.knobs),
        "status": child_ev.status.value, "fitness": fit, "parent_fitness": pfit, "created": child.created,
        "history": len(before), "group": f"{parent.id}|{shape}",
    }, ""
