"""Decoding with a LoRA adapter merged into the weights against the adapter kept apart (issue 35).

The transformers backend now serves an adapter merged into a copy of the base model
(``TransformersBackend.load_adapter``); before, the model was a ``peft.PeftModel`` whose LoRA
layers add two small products to every projection of every step. This times the operators'
own decoding loop (``complete_many``: one prefill from the prompt cache, one forward pass a
step over the live rows, free sampling, a fixed number of tokens) over three models of the same
backend: the base, the served merge, and the unmerged ``PeftModel`` of the same adapter (through
``with_model``, the path RL samples its policy with). The adapter is a real peft one with the
RL trainer's settings (``evo.rl.LoraSettings``: r 16 on the attention and MLP
projections) and random non-zero LoRA weights.

    python bench/lora_merge_bench.py [--rows 1,8,32] [--tokens 16] [--repeats 3] [--device cpu] [--out FILE]

Prints seconds per decoding step (median over repeats) per model and row count, and the
unmerged/merged ratio; writes JSON with ``--out``. A measurement script: its figures go to
bench/RESULTS.md.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MSGS = [{"role": "system", "content": "You edit CUDA kernel knobs. Answer with JSON."},
        {"role": "user", "content": "The parent kernel uses BM 128, BN 128, BK 64, 4 stages, 2 consumer warpgroups. "
                                    "Propose one change that makes it faster at 512x4096x4096."}]


def random_adapter(base, folder: Path, seed: int) -> Path:
    """The RL trainer's LoRA settings on ``base``, random non-zero weights, saved as peft saves them
    (peft starts lora_B at zero: an adapter that changes nothing would prove nothing; the tests use
    this one too)."""
    import torch
    from peft import get_peft_model

    from evo.rl import LoraSettings

    model = get_peft_model(copy.deepcopy(base), LoraSettings().config())
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
    model.save_pretrained(str(folder))
    return folder


def _step_seconds(backends: dict, rows: int, tokens: int, repeats: int) -> dict[str, float]:
    """Median seconds per decoding step of ``complete_many`` for each backend (the prompt's
    prefill cached first), the backends interleaved within each repeat so that a busy machine
    slows them alike."""
    for b in backends.values():
        b.complete_many(MSGS, rows, rng=random.Random(0), max_new_tokens=1)  # prefill into the cache
    times: dict[str, list[float]] = {name: [] for name in backends}
    for r in range(repeats):
        for name, b in backends.items():
            t0 = time.perf_counter()
            outs = b.complete_many(MSGS, rows, rng=random.Random(r + 1), temperature=1.0, max_new_tokens=tokens)
            steps = max((o.completion_tokens for o in outs), default=0) or tokens  # the longest row's steps
            times[name].append((time.perf_counter() - t0) / steps)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,8,32")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default="")
    args = ap.parse_args(argv)
    try:
        rows = [int(x) for x in args.rows.split(",") if x]
    except ValueError:
        print(f"lora_merge_bench: --rows {args.rows!r}: comma-separated integers", file=sys.stderr)
        return 2
    if not rows or min(rows) < 1 or args.tokens < 1 or args.repeats < 1:
        print("lora_merge_bench: --rows, --tokens and --repeats must be positive", file=sys.stderr)
        return 2
    from peft import PeftModel

    from operators.llm import load_backend

    backend = load_backend(device=args.device)
    backend.place()
    base = backend.model
    out: dict = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                 "host": platform.node(), "device": args.device, "model": backend.name, "tokens": args.tokens,
                 "repeats": args.repeats, "rows": {}}
    with tempfile.TemporaryDirectory(prefix="lora-bench-") as tmp:
        folder = random_adapter(base, Path(tmp) / "a", seed=0)
        unmerged = PeftModel.from_pretrained(copy.deepcopy(base), str(folder)).to(args.device).eval()
        try:
            backend.load_adapter(folder, "bench")
            merged = backend.model
            models = {"base": backend.with_model(base), "merged": backend.with_model(merged),
                      "unmerged": backend.with_model(unmerged)}
            print(f"{'rows':>5} {'base s/step':>12} {'merged s/step':>14} {'unmerged s/step':>16} {'unmerged/merged':>16}")
            for n in rows:
                fig = _step_seconds(models, n, args.tokens, args.repeats)
                fig["unmerged_over_merged"] = fig["unmerged"] / fig["merged"]
                out["rows"][str(n)] = fig
                print(f"{n:>5} {fig['base']:>12.4f} {fig['merged']:>14.4f} {fig['unmerged']:>16.4f} "
                      f"{fig['unmerged_over_merged']:>16.2f}", flush=True)
        finally:
            backend.load_adapter(None, "")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
