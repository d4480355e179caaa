"""Prompt rendering for the LLM operators, from the data files in ``operators/prompts/``.

A prompt is a system message (``common.toml``) and a user message rendered from one of
``mutation.md``, ``crossover.md``, ``fix.md`` with ``${name}`` placeholders; the answer format
comes from ``common.toml``'s ``[modes]``: the full translation unit (``source``), SEARCH/REPLACE
edits (``edits``) or a JSON knob edit (``knobs``). The context is what issue 7 lists: the shape
and contract, the ABI, the parent's source, knobs and measurements, a few strong inspirations
and the target GPU's facts; issue 25 adds the shape's class and roofline, the parent's roofline
fraction and ptxas figures, and the strongest kernels with how their knobs differ from the
parent's (:mod:`._context`, words in ``context.toml``). Keeping the words in data lets them be
tuned without code changes.
"""
from __future__ import annotations

import functools
import re
import string
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from populations import Candidate, Evaluation, Shape, Template

from .._base import ParentView
from ._context import describe_roofline, describe_siblings, shape_class

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["PROMPTS_DIR", "KINDS", "MODES", "PromptSet", "load_prompts", "render_messages", "describe_evaluation",
           "describe_knobs"]

PROMPTS_DIR = Path(__file__).resolve().parents[1] / "prompts"
KINDS = ("mutation", "crossover", "fix")
MODES = ("source", "edits", "knobs")


@dataclass(frozen=True)
class PromptSet:
    """The loaded prompt data: system text, ABI summary, GPU facts, answer formats and bodies."""

    system: str
    abi: str
    gpus: Mapping[str, Mapping[str, str]]
    modes: Mapping[str, str]
    bodies: Mapping[str, str]


@functools.lru_cache(maxsize=8)
def load_prompts(folder: Path = PROMPTS_DIR) -> PromptSet:
    """Read and check the prompt files (every kind and mode present, placeholders well formed)."""
    with open(folder / "common.toml", "rb") as fh:
        data = tomllib.load(fh)
    bodies = {kind: (folder / f"{kind}.md").read_text() for kind in KINDS}
    modes = dict(data["modes"])
    missing = set(MODES) - set(modes)
    if missing:
        raise ValueError(f"{folder / 'common.toml'}: [modes] lacks {sorted(missing)}")
    for name, text in {**bodies, **modes}.items():
        if not string.Template(text).is_valid():
            raise ValueError(f"prompt {name}: malformed ${{...}} placeholder")
    return PromptSet(system=data["system"], abi=data["abi"], gpus=dict(data["gpus"]), modes=modes, bodies=bodies)


def describe_evaluation(ev: Optional[Evaluation]) -> str:
    """Measurements as short lines: status, speedup, timings, registers, spills, shared memory, error text."""
    if ev is None:
        return "Not measured at this shape yet."
    lines = [f"status: {ev.status.value}" + (f" (flags: {', '.join(ev.flags)})" if ev.flags else "")]
    if ev.speedup is not None:
        lines.append(f"speedup over cuBLAS: {ev.speedup:.3f}x")
    if ev.roofline_frac is not None:
        lines.append(f"roofline fraction: {ev.roofline_frac:.3f} (1.0 = the shape's floor on this GPU)")
    for name, t in sorted(ev.timers.items()):
        lines.append(f"{name} time: {t.median * 1e6:.1f} us (cuBLAS {t.baseline_median * 1e6:.1f} us)")
    for ks in ev.kernels:
        lines.append(f"kernel {ks.name} (ptxas): {ks.registers} registers, {ks.spill_stores} B spill stores, "
                     f"{ks.spill_loads} B spill loads, {ks.smem_static} B static shared memory")
    if ev.max_error is not None:
        lines.append(f"max error: {ev.max_error:.3g}")
    if ev.message.strip():
        msg = ev.message.strip()
        lines.append("message: " + (msg if len(msg) <= 1500 else msg[:1500] + " ..."))
    return "\n".join(lines)


def _json_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return f'"{v}"'
    return str(v)


def describe_knobs(template: Optional[Template], knobs: Optional[Mapping[str, Any]], constraints: bool = True) -> str:
    """One line per knob: current value, domain, axis and doc; the constraints' reasons after
    (left out with ``constraints=False``: where the decoding grammar already refuses every
    invalid set, they are 100-500 prompt tokens the model cannot use)."""
    if template is None or not knobs:
        return "None: this kernel was not built from a template."
    lines = []
    for name, knob in template.space.knobs.items():
        dom = ", ".join(_json_value(v) for v in knob.values)
        doc = f" - {knob.doc}" if knob.doc else ""
        lines.append(f"{name} = {_json_value(knobs.get(name, knob.default))}  (one of {dom}; {knob.axis}){doc}")
    if constraints and template.space.constraints:
        lines.append("Constraints: " + "; ".join(c.reason for c in template.space.constraints))
    return "\n".join(lines)


def _summary(c: Candidate) -> str:
    origin = f"template {c.template}" if c.template else "hand/LLM-written source"
    return f"{origin}; operator {c.operator}; generation {c.generation}"


def _source(c: Candidate, max_chars: int) -> str:
    if max_chars <= 0:
        return "(omitted: edit the knobs)"
    text = c.source if len(c.source) <= max_chars else c.source[:max_chars] + "\n// ... (truncated)"
    return f"```cuda\n{text}\n```"


def render_messages(kind: str, mode: str, parents: Sequence[ParentView], shape: Shape, *,
                    template: Optional[Template] = None, arch: Any = 90, inspirations: Sequence[ParentView] = (),
                    max_changes: int = 2, source_chars: int = 4000,
                    prompts: Optional[PromptSet] = None, constraints: bool = True) -> list[dict[str, str]]:
    """Chat messages (system, user) asking for a ``mode`` answer of ``kind`` for ``parents[0]`` (and ``[1]``).

    In ``knobs`` mode the kernel ABI is left out (no source is written; 160 tokens of the
    default model), and ``constraints=False`` leaves out the knob constraints too (for models
    that decode under the knob grammar, which refuses every invalid set)."""
    if kind not in KINDS or mode not in MODES:
        raise ValueError(f"kind must be one of {KINDS} and mode one of {MODES}, got {kind!r}, {mode!r}")
    if not parents or (kind == "crossover" and len(parents) < 2):
        raise ValueError(f"a {kind} prompt needs {'two parents' if kind == 'crossover' else 'a parent'}")
    ps = prompts or load_prompts()
    cc = str(arch).lower().removeprefix("sm_").rstrip("a")
    gpu = ps.gpus.get(cc, {"name": f"compute capability {cc}", "facts": ""})
    first = parents[0]
    cls = shape_class(shape)
    example_knob, example_value = "KNOB", "1"
    if template is not None:
        knob = next(iter(template.space.knobs.values()))
        example_knob, example_value = knob.name, _json_value(knob.values[-1])
    output = string.Template(ps.modes[mode]).substitute(max_changes=max_changes, example_knob=example_knob,
                                                        example_value=example_value)
    fields = {
        "shape": str(shape), "m": shape.m, "n": shape.n, "k": shape.k, "layout": shape.layout,
        "contract": shape.contract, "flops": f"{2 * shape.m * shape.n * shape.k / 1e9:.3f}",
        "shape_class": cls.name, "class_hint": cls.hint, "roofline": describe_roofline(shape),
        "gpu_name": gpu["name"], "gpu_facts": gpu["facts"], "abi": "" if mode == "knobs" else ps.abi,
        "parent_id": first.id, "parent_summary": _summary(first.candidate),
        "parent_measurements": describe_evaluation(first.evaluation),
        "parent_knobs": describe_knobs(template, first.candidate.knobs, constraints),
        "parent_source": _source(first.candidate, source_chars),
        "inspirations": describe_siblings(first, inspirations), "output": output,
    }
    if kind == "crossover":
        other = parents[1]
        fields.update(other_id=other.id, other_summary=_summary(other.candidate),
                      other_measurements=describe_evaluation(other.evaluation),
                      other_knobs=describe_knobs(template, other.candidate.knobs, constraints))
    body = ps.bodies[kind]
    if not fields["abi"]:  # its paragraph goes with it (the shown source, if any, keeps its blank lines)
        body = re.sub(r"\$\{abi\}\n\n?", "", body)
    user = string.Template(body).substitute(fields)
    return [{"role": "system", "content": ps.system}, {"role": "user", "content": user}]
