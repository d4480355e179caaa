"""Prompt tokens of the LLM operator's knob-mode mutation prompt, as the default model's tokenizer
counts them (chat template included), for a few templates' first seeds: as the operator renders
it now, and with the kernel ABI and the knob constraints put back (what it sent before they were
left out for in-process models). CPU only; the figures are deterministic.

    PYTHONPATH=$PWD python bench/prompt_tokens.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = [("sm90_wgmma", "64x4096x4096"), ("gemv", "1x4096x4096"), ("swab", "8x4096x4096"), ("sm80_mma", "512x896x4864")]


def main() -> int:
    from operators import OperatorContext, ParentView
    from operators.llm import LLMOperator, load_backend
    from operators.llm._prompts import load_prompts
    from populations import Evaluation, Shape, Status, TimerResult, load_templates

    tok = load_backend().tokenizer
    templates = load_templates()
    abi = load_prompts().abi
    print("| template | shape | prompt tokens now | with ABI and constraints | saved |")
    print("|---|---|---:|---:|---:|")
    for name, text in CASES:
        t, shape = templates[name], Shape.parse(text)
        cands = [t.candidate(k, shape) for k in t.heuristic(shape)[:3]]
        evs = [Evaluation(c.id, shape, Status.OK, timers={"device": TimerResult(*(6 * [10e-6 * (1 + i / 10)]), 5)})
               for i, c in enumerate(cands)]
        ctx = OperatorContext(list(zip(cands, evs)), templates, arch=90)
        op = LLMOperator(mode="knobs")
        now = op.messages([ParentView(cands[0], evs[0])], shape, ctx, t)
        op._constraints_wanted = lambda: True  # type: ignore[method-assign]  # as a server's model gets it
        full = op.messages([ParentView(cands[0], evs[0])], shape, ctx, t)
        full[1]["content"] = full[1]["content"].replace("\n\n## Parent", f"\n\n{abi}\n\n## Parent", 1)

        def count(msgs: list) -> int:
            return len(tok.apply_chat_template(msgs, add_generation_prompt=True, return_dict=True)["input_ids"])

        a, b = count(now), count(full)
        print(f"| {name} | {shape} | {a:,} | {b:,} | {1 - a / b:.0%} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
