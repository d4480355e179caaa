"""Batched LLM knob edits (issue 25): seconds and tokens per valid knob edit at batch 1, 2, 4, 8.

The LLM operator in knob mode samples its children of one prompt together
(``TransformersBackend.complete_many``: one prefill, one forward pass per step over the live
rows). This script runs the real operator (``LLMOperator``, knob mode, the default model
SmolLM2-135M-Instruct in process) on a realistic prompt: a parent from a real template
(``populations/templates``) at the shape's heuristic knobs, measured, with two measured siblings
as inspirations, the way ``evo run`` builds it. Per batch size, ``--calls`` operator calls of
``n = batch`` children each (one model call each: ``max_attempts = 1``), each from a fresh seed.
A valid edit is a proposal the operator returns: finished under the grammar, valid, and new
(not the history's, not another row's).

The prompt's prefill is measured once, cold (``prefill_s``); the calls then find the prompt's
KV cache kept (the backend's prefix cache), so their seconds are decoding alone, the part that
batching changes (on a 2-core CPU a ~2,000-token prefill takes tens of seconds and would drown
it). A call on a new parent pays both: ``s_per_valid_edit_cold`` = (prefill_s + s_per_call) /
valid edits per call. Tokens are the operator's count (the prompt once per call, whether cached
or not, plus every row's completion tokens). On a GPU the model's GPU seconds are reported too.

    PYTHONPATH=$PWD python bench/llm_batch_bench.py --calls 2 --out results/llm_batch_cpu.json
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from operators import OperatorContext, ParentView  # noqa: E402
from operators.llm import LLMOperator, get_backend  # noqa: E402
from populations import Evaluation, KernelStats, Shape, Status, TimerResult, load_templates  # noqa: E402


def measured(cand, shape: Shape, speedup: float) -> Evaluation:  # type: ignore[no-untyped-def]
    t = TimerResult(1e-4 / speedup, 0.9e-4 / speedup, 1.1e-4 / speedup, 1e-4, 0.9e-4, 1.1e-4, 10)
    return Evaluation(cand.id, shape, Status.OK, timers={"device": t},
                      kernels=(KernelStats("evo_gemm", registers=128, spill_stores=0, smem_static=32768),))


def family(template_name: str, shape: Shape) -> tuple[ParentView, OperatorContext]:
    """A measured parent at the template's heuristic knobs and two measured siblings."""
    templates = load_templates()
    t = templates[template_name]
    picks = t.heuristic(shape, arch=90)[:3]
    hist = [(t.candidate(k, shape), None) for k in picks]
    hist = [(c, measured(c, shape, s)) for (c, _), s in zip(hist, (0.92, 0.85, 0.71))]
    ctx = OperatorContext(hist, templates, arch=90)
    return ParentView(*hist[0]), ctx


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", default="1,2,4,8", help="batch sizes (comma-separated)")
    ap.add_argument("--calls", type=int, default=2, help="operator calls per batch size")
    ap.add_argument("--template", default="sm80_mma")
    ap.add_argument("--shape", default="4096x4096x4096:TN")
    ap.add_argument("--device", default=None, help="where the model runs (default: the model's own, cpu here)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="JSON file to write")
    args = ap.parse_args(argv)
    shape = Shape.parse(args.shape)
    parent, ctx = family(args.template, shape)
    batches = [int(b) for b in args.batches.split(",")]

    probe = LLMOperator(device=args.device)
    backend = get_backend(probe._spec(probe.model))
    t0 = time.perf_counter()
    probe.warm()
    warm_s = time.perf_counter() - t0
    template = ctx.template(parent.template)
    messages = probe.messages((parent,), shape, ctx, template)
    from operators.llm import PREFIX
    ids = backend.prompt_ids(messages, PREFIX)
    backend._cache.clear()
    t0 = time.perf_counter()
    backend._prefill(ids)
    prefill_s = time.perf_counter() - t0
    # the same parent with other inspirations (a later call on it): its prefill starts from the
    # shared prefix of the cached prompt (TransformersBackend's prefix reuse), only the tail computed
    other = probe.messages((parent,), shape, OperatorContext(list(ctx.history[:2]), ctx.templates, arch=90), template)
    ids2 = backend.prompt_ids(other, PREFIX)
    reused0 = backend.prefill_reused_tokens
    t0 = time.perf_counter()
    backend._prefill(ids2)
    prefix_s, prefix_reused = time.perf_counter() - t0, backend.prefill_reused_tokens - reused0
    print(f"model {backend.name} on {backend.device}; prompt {len(ids)} tokens; cold prefill {prefill_s:.3f} s; "
          f"warm {warm_s:.1f} s; the same parent with other inspirations ({len(ids2)} tokens): "
          f"{prefix_reused} reused, prefill {prefix_s:.3f} s", flush=True)

    rows = []
    for b in batches:
        op = LLMOperator(device=args.device, batch=b, max_attempts=1)
        wall = gpu = 0.0
        tokens = valid = failed = 0
        reasons: dict[str, int] = {}
        for call in range(args.calls):
            rng = random.Random(args.seed * 1000 + call)
            t0 = time.perf_counter()
            props = op.propose((parent,), shape, rng, b, ctx)
            wall += time.perf_counter() - t0
            tokens += op.take_tokens()
            gpu += op.take_gpu_seconds()
            valid += sum(p.ok for p in props)
            for p in props:
                if not p.ok:
                    failed += 1
                    why = p.reason.split("; last: ")[-1][:60]
                    reasons[why] = reasons.get(why, 0) + 1
        outcome = op.outcomes[op.model]
        row = {"batch": b, "calls": args.calls, "rows": int(outcome["rows"]), "valid_edits": valid,
               "valid_share": round(valid / max(1, outcome["rows"]), 3), "wall_s": round(wall, 3),
               "tokens": tokens, "gpu_s": round(gpu, 4),
               "s_per_call": round(wall / args.calls, 3),
               "s_per_valid_edit": round(wall / valid, 3) if valid else None,
               "s_per_valid_edit_cold": round((prefill_s * args.calls + wall) / valid, 3) if valid else None,
               "tokens_per_valid_edit": round(tokens / valid, 1) if valid else None,
               "gpu_s_per_valid_edit": round(gpu / valid, 4) if valid else None,
               "duplicates_dropped": int(outcome["duplicates"]), "failures": reasons}
        rows.append(row)
        print(f"batch {b}: {valid}/{row['rows']} valid edits in {args.calls} calls, {wall:.2f} s "
              f"({row['s_per_call']} s/call, {row['s_per_valid_edit']} s/edit, {row['s_per_valid_edit_cold']} with prefill), {tokens} tokens "
              f"({row['tokens_per_valid_edit']} /edit), failures {reasons}", flush=True)

    doc = {"format": "evo-llm-batch-bench/1", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": git_commit(), "command": " ".join(["python", "bench/llm_batch_bench.py", *(argv or sys.argv[1:])]),
           "machine": platform.processor() or platform.machine(), "model": backend.name, "device": str(backend.device),
           "template": args.template, "shape": str(shape), "prompt_tokens": len(ids), "prefill_s": round(prefill_s, 4),
           "prefix_reuse": {"prompt_tokens": len(ids2), "reused_tokens": prefix_reused, "prefill_s": round(prefix_s, 4)},
           "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
