"""``evo rl``: RL updates of the LLM operator's model from archives.

``evo rl export ARCHIVE... --out DATASET.jsonl [--since T] [--last N]`` writes every evaluated
LLM-made candidate as a (prompt, completion, reward) row in JSON lines (trl's conversational
prompt/completion format plus reward, advantage, group and provenance columns; evo.rl._dataset).
With ``--pairs`` it writes every measured parent-child pair of every operator instead, with its
gain and the prompt rebuilt from the history before the child (evo.rl._pairs).

``evo rl train --dataset DATASET.jsonl [--archive DIR...] --out ADAPTER_DIR [--model M]
[--steps N] [--seed S] [--group-size G] [--lr X] [--beta X] [--init-adapter DIR] [--version N]``
runs GRPO with LoRA on the dataset's knob-edit groups; rewards of sampled completions come from
the dataset's own rows and the given archives (completions that map to no measured candidate
get a penalty), the group's archived completions and its parent's best archived children are
replayed beside the samples, and writes a peft adapter with its evo-adapter.json manifest. With
``--measure ARCHIVE`` the evaluator is in the loop: sampled edits no archive measured are timed on
the local GPUs and recorded there (evo.rl._measure), instead of scoring the penalty. Exit 2 on bad input.

``evo rl rank --dataset PAIRS.jsonl --out ADAPTER_DIR [--steps N] [--loss pairwise|weighted]
[--holdout F] [--init-adapter DIR]`` trains the LoRA adapter as a ranker of knob edits on pairs
(evo.rl._rank): within each parent's children, the measured better child gets the higher
log-likelihood, which is what the LLM cost model (``--operators llm_ranked``) scores; whole shapes
are held out and the ranking before and after is printed and kept in the manifest.

``evo rl split --layers llm_layers.csv --out SPLIT.json [--test-model M...] [--seed S]
[--grid-size N...]`` splits the shapes by model (evo.rl._split): no test shape's model, and no
test shape, is on the training side; the grid (sizes cubed) joins training. ``--reward
improvement`` (export, train) scores a child by its gain over the parent in GPU time.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ._cmd_args import UsageError, add_gpus, count, fail, gpu_list, open_reader, open_writer

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("rl", help="export RL datasets from archives and train LoRA adapters (GRPO)",
                              description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="rl_command", metavar="ACTION")
    sub.required = True
    e = sub.add_parser("export", help="write an archive's LLM-made candidates as a JSONL RL dataset")
    e.add_argument("archives", nargs="+", metavar="ARCHIVE", help="archive directories (read only; damage is reported)")
    e.add_argument("--out", required=True, metavar="DATASET.jsonl", help="output file (JSON lines)")
    e.add_argument("--since", type=float, default=0.0, metavar="T", help="only candidates created at or after T (unix time)")
    e.add_argument("--last", type=count(1), metavar="N", help="only the newest N rows (N >= 1)")
    e.add_argument("--reward", choices=("speedup", "improvement"), default="speedup",
                   help="speedup: log speedup over cuBLAS (default); improvement: log gain over the parent in GPU "
                        "time, 0 for an invalid or slower child")
    e.add_argument("--pairs", action="store_true",
                   help="every measured parent-child pair of every operator (not only the LLM's), with its gain "
                        "and the prompt rebuilt from the history before the child (evo.rl._pairs)")
    t = sub.add_parser("train", help="GRPO + LoRA on a dataset; writes a versioned adapter")
    t.add_argument("--dataset", required=True, metavar="DATASET.jsonl", help="the rows evo rl export wrote")
    t.add_argument("--archive", action="append", default=[], metavar="DIR", help="more rewards (repeatable)")
    t.add_argument("--out", required=True, metavar="ADAPTER_DIR",
                   help="adapter folder; each training writes a new version folder inside it")
    t.add_argument("--model", default=None, help="the base model (default: the LLM operator's default)")
    t.add_argument("--device", default="cpu", help="where the model trains: cpu (default), cuda or cuda:N")
    t.add_argument("--steps", type=count(1, 10 ** 6), default=8, metavar="N", help="GRPO steps (default 8)")
    t.add_argument("--seed", type=int, default=0, help="random seed for sampling and prompt order (default 0)")
    t.add_argument("--group-size", type=count(2, 4096), default=8, metavar="G",
                   help="completions sampled per prompt; their rewards are compared within the group (default 8)")
    t.add_argument("--lr", type=float, default=2e-3, help="LoRA learning rate (default 0.002)")
    t.add_argument("--beta", type=float, default=0.02, help="KL weight against the base model")
    t.add_argument("--init-adapter", metavar="DIR", help="continue training this adapter")
    t.add_argument("--reward", choices=("speedup", "improvement"), default="speedup",
                   help="how --archive records and fresh samples are scored (the dataset's rows keep theirs)")
    t.add_argument("--version", type=int, help="version number (default: the init adapter's + 1, else 1)")
    t.add_argument("--max-seconds", type=float, default=0.0, metavar="S",
                   help="no GRPO step starts S seconds after the start (the adapter is still saved); 0: no limit")
    t.add_argument("--measure", metavar="ARCHIVE",
                   help="online RL: measure every sampled edit no archive has a reward for on the local GPUs (the "
                        "evaluator in the loop) and record it in this archive (created if missing, read as rewards "
                        "when it exists); without it such an edit scores the unmapped penalty")
    add_gpus(t)
    t.add_argument("--compile-workers", type=int, default=4, metavar="N", help="with --measure: NVRTC workers (default 4)")
    r = sub.add_parser("rank", help="train the LLM as a ranker of knob edits on evo rl export --pairs data (LoRA)")
    r.add_argument("--dataset", required=True, metavar="PAIRS.jsonl", help="the rows evo rl export --pairs wrote")
    r.add_argument("--out", required=True, metavar="ADAPTER_DIR", help="where the adapter and its manifest go (new or empty)")
    r.add_argument("--model", default=None, help="the base model (default: the LLM operator's default)")
    r.add_argument("--device", default="cpu", help="where the model trains: cpu (default), cuda or cuda:N")
    r.add_argument("--steps", type=count(1, 10 ** 6), default=64, metavar="N", help="optimiser steps, one group each (default 64)")
    r.add_argument("--loss", choices=("pairwise", "weighted"), default="pairwise",
                   help="pairwise: RankNet over ordered pairs of one parent's children (default); "
                        "weighted: reward-weighted likelihood")
    r.add_argument("--lr", type=float, default=5e-4, help="LoRA learning rate (default 0.0005)")
    r.add_argument("--holdout", type=float, default=0.25, metavar="F",
                   help="share of the shapes held out to measure the ranking (default 0.25; 0: none)")
    r.add_argument("--max-children", type=count(2, 4096), default=16, metavar="N",
                   help="children of one group in one step (a seeded sample of larger groups; default 16)")
    r.add_argument("--seed", type=int, default=0, help="random seed for the split, order and samples (default 0)")
    r.add_argument("--init-adapter", metavar="DIR", help="continue training this adapter")
    r.add_argument("--version", type=int, help="version number (default: the init adapter's + 1, else 1)")
    r.add_argument("--max-seconds", type=float, default=0.0, metavar="S", help="stop starting steps after S seconds")
    s = sub.add_parser("split", help="split llm_layers.csv's shapes into train and test by model (JSON)")
    s.add_argument("--layers", required=True, metavar="CSV", help="M,N,K,model,layer rows (llm_layers.csv)")
    s.add_argument("--out", required=True, metavar="SPLIT.json", help="where the split is written (JSON)")
    s.add_argument("--test-model", action="append", dest="test_models", metavar="MODEL",
                   help="a test model (repeatable; default: a third of the models, drawn with --seed)")
    s.add_argument("--seed", type=int, default=0, help="random seed for drawing the test models (default 0)")
    s.add_argument("--grid-size", action="append", dest="grid", type=int, metavar="N",
                   help="add the grid of these sizes (every M, N, K among them) to training (repeatable)")


def _split(args: argparse.Namespace) -> int:
    from populations import Shape

    from ..rl import read_layers, split_by_model

    try:
        rows = read_layers(args.layers)
        grid = [Shape(m, n, k) for m in args.grid or () for n in args.grid for k in args.grid]
        split = split_by_model(rows, test_models=args.test_models, seed=args.seed, grid=grid)
        split.write(args.out)
    except (OSError, ValueError, KeyError) as exc:
        return fail("rl split", exc)
    print(f"evo rl split: {len(split.train)} train shapes ({', '.join(split.train_models)}), {len(split.test)} test "
          f"shapes ({', '.join(split.test_models)}), {len(split.withheld)} withheld -> {args.out}")
    return 0


def _export(args: argparse.Namespace) -> int:
    from populations import ArchiveError

    from ..rl import export_rows, write_jsonl

    if args.pairs and (args.last is not None or args.reward != "speedup"):
        return fail("rl export", "--pairs writes every pair with its gain; --last and --reward do not apply")
    archives = []
    skipped: dict = {}
    try:
        for path in args.archives:
            archives.append(open_reader("rl export", path)[0])  # damage: one warning line per problem
        from ..rl import RewardConfig, export_pairs
        if args.pairs:
            rows, skipped = export_pairs(archives, since=args.since)
        else:
            rows = export_rows(archives, since=args.since, last=args.last, config=RewardConfig(kind=args.reward))
    except ArchiveError as exc:
        return fail("rl export", exc)
    finally:
        for a in archives:
            a.close()
    try:
        n = write_jsonl(rows, args.out)
    except OSError as exc:
        return fail("rl export", f"--out {args.out}: cannot write the dataset there: {exc.strerror or exc}")
    groups = len({r["group"] for r in rows})
    print(f"evo rl export: {n} {'pairs' if args.pairs else 'rows'} in {groups} groups -> {args.out}")
    for why, count in sorted(skipped.items(), key=lambda kv: -kv[1]):
        print(f"evo rl export: left out {count}: {why}")
    return 0


def _train(args: argparse.Namespace, pool_factory: Any = None) -> int:
    import time

    deadline = time.monotonic() + args.max_seconds if args.max_seconds > 0 else None
    from populations import ArchiveError, load_templates

    from ..rl import DatasetError, read_jsonl
    from ..rl import read_manifest, table_from_rows, train_adapter
    from ..rl import GRPOConfig

    try:
        from evaluators import visible_gpus
        from operators.llm import check_device

        check_device(args.device, len(visible_gpus()) if args.device != "cpu" else 0)
        rows = read_jsonl(args.dataset)
        config = GRPOConfig(steps=args.steps, group_size=args.group_size, lr=args.lr, beta=args.beta, seed=args.seed)
        version, parent = 1, None
        if args.init_adapter:
            m = read_manifest(args.init_adapter)
            version, parent = m.version + 1, m.name
        version = args.version if args.version is not None else version
        from ..rl import RewardConfig
        table = table_from_rows(rows, RewardConfig(kind=args.reward))
        archives = [open_reader("rl train", path)[0] for path in args.archive]  # damage: warned
        for a in archives:
            table.add_archive(a)
        if Path(args.out).exists() and any(Path(args.out).iterdir()):
            raise ValueError(f"--out {args.out} exists and is not empty")
    except (DatasetError, ArchiveError, ValueError) as exc:
        return fail("rl train", exc)
    except OSError as exc:
        return fail("rl train", f"{exc.filename or args.out}: {exc.strerror or exc}")
    from operators.llm import DEFAULT_MODEL, load_backend

    from ..rl import prompts_from_rows
    from ..rl import Policy

    templates = load_templates(errors="warn")
    if not prompts_from_rows(rows, templates)[0]:
        return fail("rl train", "no trainable rows (knob edits of a loaded template's parent) in the dataset")
    measurer = gate = None
    if args.measure:
        try:
            measurer, gate = _measurer(args, table, pool_factory)
        except (ArchiveError, UsageError) as exc:
            return fail("rl train", exc)
        except Exception as exc:  # a pool that cannot start (no GPU, a worker failing): one line
            return fail("rl train", f"--measure: cannot start the evaluator pool: {type(exc).__name__}: {exc}")
    try:
        backend = load_backend(args.model or DEFAULT_MODEL, args.device)
        policy = Policy(backend, seed=args.seed, init_adapter=args.init_adapter, gate=gate)
        manifest = train_adapter(rows, args.out, policy=policy, templates=templates, table=table, config=config,
                                 version=version, parent_adapter=parent, log=lambda m: print(m, flush=True),
                                 demos=archives, deadline=deadline,
                                 evaluate_many=measurer.evaluate_many if measurer else None)
    finally:
        for a in archives:
            a.close()
        if measurer is not None:
            measurer.close()
            measurer.pool.close()
    if measurer is not None:
        print(f"evo rl train: {measurer.measured} new edits measured on the GPU ({measurer.lost} lost) -> {args.measure}")
    print(f"evo rl train: adapter {manifest.name} -> {args.out} "
          f"(rewards from {dict(manifest.reward_sources)})")
    return 0


def _measurer(args: argparse.Namespace, table: Any, pool_factory: Any) -> tuple[Any, Any]:
    """The evaluator in the loop (evo.rl._measure) and the lease the policy holds when its model
    shares one of the pool's GPUs; the archive's earlier measurements join ``table``."""
    from ..search import PoolConfig
    from ._orchestrate import make_pool
    from ..rl import Measurer, colocated_gate

    gpus = gpu_list(args.gpus)
    if args.compile_workers < 1:
        raise UsageError(f"--compile-workers {args.compile_workers}: needs at least 1")
    archive = open_writer("rl train", args.measure)  # before the pool: a bad path costs no worker start
    try:
        table.add_archive(archive)
        pool = (pool_factory or make_pool)(PoolConfig(gpus=gpus or [], compile_workers=args.compile_workers))
    except BaseException:
        archive.close()
        raise
    pool_gpus = list(getattr(pool, "gpus", ()) or ())
    gate = colocated_gate(args.device, pool_gpus)
    print(f"evo rl train: measuring new edits on GPU(s) {pool_gpus} -> {args.measure}"
          + ("; the model is co-located: generation and training wait for timed regions (GPU lease)" if gate else ""),
          flush=True)
    return Measurer(pool, archive), gate


def _rank(args: argparse.Namespace) -> int:
    import json
    import time

    from populations import load_templates

    from ..rl import DatasetError, RankConfig, read_jsonl, read_manifest

    deadline = time.monotonic() + args.max_seconds if args.max_seconds > 0 else None
    try:
        from evaluators import visible_gpus
        from operators.llm import check_device

        check_device(args.device, len(visible_gpus()) if args.device != "cpu" else 0)
        config = RankConfig(steps=args.steps, lr=args.lr, seed=args.seed, loss=args.loss, holdout=args.holdout,
                            max_children=args.max_children)
        rows = read_jsonl(args.dataset)
        if rows and "gain" not in rows[0]:
            raise ValueError(f"{args.dataset}: not pairs (no 'gain'); write them with evo rl export --pairs")
        version, parent = 1, None
        if args.init_adapter:
            m = read_manifest(args.init_adapter)
            version, parent = m.version + 1, m.name
        version = args.version if args.version is not None else version
        if Path(args.out).exists() and any(Path(args.out).iterdir()):
            raise ValueError(f"--out {args.out} exists and is not empty")
        from ..rl import rank_groups
        templates = load_templates(errors="warn")
        if not rank_groups(rows, templates)[0]:
            raise ValueError(f"{args.dataset}: no group to rank (a parent at a shape with two children of different outcomes)")
    except (DatasetError, ValueError) as exc:
        return fail("rl rank", exc)
    except OSError as exc:
        return fail("rl rank", f"{exc.filename or args.dataset}: {exc.strerror or exc}")
    from operators.llm import DEFAULT_MODEL, load_backend

    from ..rl import Policy, train_rank_adapter

    backend = load_backend(args.model or DEFAULT_MODEL, args.device)
    policy = Policy(backend, seed=args.seed, init_adapter=args.init_adapter)
    try:
        manifest, report = train_rank_adapter(rows, args.out, policy=policy, templates=templates, config=config,
                                              version=version, parent_adapter=parent,
                                              log=lambda m: print(m, flush=True), deadline=deadline)
    except ValueError as exc:
        return fail("rl rank", exc)
    held = report.get("held_out_after") or report.get("train_after") or {}
    print(f"evo rl rank: adapter {manifest.name} -> {args.out} "
          f"({'held-out' if 'held_out_after' in report else 'training'} pairwise accuracy "
          f"{(report.get('held_out_before') or report.get('train_before') or {}).get('pairwise_accuracy')} -> "
          f"{held.get('pairwise_accuracy')}; report in {json.dumps(str(Path(args.out) / 'evo-adapter.json'))})")
    return 0


def run(args: argparse.Namespace, *, pool_factory: Any = None) -> int:
    """``pool_factory``: the evaluator pool ``train --measure`` uses instead of the GPUs' (for
    programs embedding the command line, as the tests do with their stand-in pool)."""
    if args.rl_command == "split":
        return _split(args)
    if args.rl_command == "rank":
        return _rank(args)
    return _export(args) if args.rl_command == "export" else _train(args, pool_factory)
