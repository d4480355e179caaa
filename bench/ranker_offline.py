"""Offline ranking check of the cost models on a real archive (issue 35): do they order the
measured children of one parent, on shapes they never saw, better than chance?

    python bench/ranker_offline.py --archive DIR [--holdout 0.34] [--seed 0] [--steps 64]
                                   [--device cpu] [--no-llm] [--json OUT]
    python bench/ranker_offline.py --archive DIR --seed 1 --reuse-llm OUT.json   # new tabular, saved LLM rows
    python bench/ranker_offline.py --compare OUT.json [OUT2.json ...]    # paired differences, no model

From the archive, every measured parent-child pair of every operator (``evo rl export --pairs``)
grouped by parent and shape (:func:`evo.rl.rank_groups`); whole shapes held out with the seed
(:func:`evo.rl.split_groups`). On the held-out groups, each ranker scores the children and
:func:`evo.rl.ranking_metrics` compares the order with the measured gains:

- ``random``: scores drawn at random (50 draws, the mean);
- ``tabular``: the tabular cost model (scikit-learn's gradient-boosted trees) fitted on every
  measured record of the training shapes (transfer: it has seen no record of the held-out shape,
  where a run's ranker would also learn online from that shape's own history);
- ``llm base``: the LLM scorer's zero-shot log-likelihoods (SmolLM2-135M);
- ``llm ranked``: the same model after ``--steps`` steps of ``evo rl rank`` on the training groups.

Each scored ranker gets a 95% interval of its pairwise accuracy by resampling whole held-out groups
(1,000 draws), and each scored ranker's difference from the tabular one (and the trained LLM's from
the base LLM) a paired interval: the same resampled groups scored by both, so the interval says
whether one ranker beats the other, which two overlapping intervals cannot. The JSON keeps every
held-out group's gains and each ranker's scores; ``--compare`` reads such files (one per split
seed) and gives the paired differences per seed and pooled over the seeds (groups resampled
within each seed, every split weighted by its pairs).

A measurement script, not a test: its figures go to bench/RESULTS.md (issue 35's table).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from evo.rl import (RankConfig, RankGroup, export_pairs, pairwise_counts, rank_groups, ranking_metrics,  # noqa: E402
                    split_groups)
from populations import Archive, ArchiveError, Shape, load_templates  # noqa: E402
from _ablation_stats import ci95  # noqa: E402


def _tabular_scores(archive: Archive, train_shapes: set[str], held: list[Any]) -> Optional[list[list[float]]]:
    """The tabular model, fitted on the training shapes' records, scoring each held-out group."""
    from operators import ParentView, archive_records, cost_models, get_cost_model

    if "tabular" not in cost_models():
        return None
    model = get_cost_model("tabular")
    shapes = [s for s in archive.shapes() if str(s) in train_shapes]
    model.update(archive_records(archive, shapes))
    out = []
    for g in held:
        shape = Shape.parse(g.shape)
        cands = {c.id: c for c in archive.candidates(shape)}
        evs = {ev.candidate_id: ev for ev in archive.evaluations(shape)}
        parent = ParentView(cands[g.parent], evs.get(g.parent)) if g.parent in cands else None
        out.append(list(model.predict(shape, [cands[c] for c in g.candidates], parent)))
    return out


def _interval(held: list[Any], scores: list[list[float]], seed: int, draws: int = 1000) -> list[Optional[float]]:
    """95% interval of the pairwise accuracy, resampling whole groups (pairs of one parent are not
    independent draws)."""
    rng = random.Random(seed)
    values = []
    for _ in range(draws):
        pick = [rng.randrange(len(held)) for _ in held]
        right, total = pairwise_counts([held[i] for i in pick], [scores[i] for i in pick])
        if total:
            values.append(round(right / total, 4))
    return ci95(values)


#: the paired comparisons: (ranker, against)
COMPARISONS = (("llm ranked", "tabular"), ("llm base", "tabular"), ("llm ranked", "llm base"))


def paired_difference(splits: list[tuple[list[Any], list[list[float]], list[list[float]]]], seed: int,
                      draws: int = 1000) -> dict[str, Any]:
    """Pairwise accuracy of ranker a minus ranker b over one or more splits (each: held-out groups,
    a's scores, b's scores), with a 95% interval from resampling whole groups within each split; the
    pooled accuracy is over all the splits' pairs together."""
    def diff(picks: list[list[int]]) -> tuple[Optional[float], int]:
        ra = rb = 0.0
        tot = 0
        for (held, a, b), pick in zip(splits, picks):
            groups = [held[i] for i in pick]
            r1, t = pairwise_counts(groups, [a[i] for i in pick])
            r2, _ = pairwise_counts(groups, [b[i] for i in pick])
            ra, rb, tot = ra + r1, rb + r2, tot + t
        return ((ra - rb) / tot if tot else None), tot

    point, pairs = diff([list(range(len(held))) for held, _, _ in splits])
    rng = random.Random(seed)
    values = [v for v, _ in (diff([[rng.randrange(len(held)) for _ in held] for held, _, _ in splits])
                             for _ in range(draws)) if v is not None]
    return {"difference": None if point is None else round(point, 4), "ci95": ci95(values), "pairs": pairs}


def _groups_from_json(result: dict[str, Any]) -> list[RankGroup]:
    """The held-out groups of a saved result (gains only: enough to count ordered pairs)."""
    return [RankGroup(key=g["key"], shape=g["shape"], messages=(), edits=tuple(str(i) for i in range(len(g["gains"]))),
                      gains=tuple(float("-inf") if x is None else float(x) for x in g["gains"]))
            for g in result["groups"]]


def _reuse_llm(path: str, held: list[Any], args: argparse.Namespace, scored: dict[str, list[list[float]]],
               result: dict[str, Any]) -> Optional[str]:
    """Copy a saved result's LLM scores into ``scored`` when it is the same split; why not, else."""
    try:
        saved = json.loads(Path(path).read_text())
        keys = [g["key"] for g in saved["groups"]]
        llm = {name: saved["scores"][name] for name in ("llm base", "llm ranked") if name in saved["scores"]}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"not a result of this script ({exc})"
    if (saved.get("seed"), saved.get("holdout")) != (args.seed, args.holdout) or keys != [g.key for g in held]:
        return "another split (seed, holdout or held-out groups differ)"
    if not llm or any(len(s) != len(g.edits) for scores in llm.values() for s, g in zip(scores, held)):
        return "no LLM scores for these groups"
    scored.update(llm)
    result["llm_steps"], result["llm_from"] = saved.get("llm_steps"), str(path)
    return None


def compare(paths: list[str]) -> int:
    """Paired differences of saved results, per split and pooled (``--compare``)."""
    results = []
    for path in paths:
        try:
            r = json.loads(Path(path).read_text())
            results.append((r, _groups_from_json(r)))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            print(f"ranker_offline: --compare {path}: not a result of this script ({exc})", file=sys.stderr)
            return 2
    splits = [(r.get("archive"), r.get("seed"), r.get("holdout")) for r, _ in results]
    if len(set(splits)) < len(splits):
        print("ranker_offline: --compare: the same split twice (archive, seed, holdout): pooling it would count "
              "its groups twice", file=sys.stderr)
        return 2
    print("| comparison | split seed | ordered pairs | accuracy difference | 95% interval (groups resampled) |")
    print("|---|---|---:|---:|---:|")
    for a, b in COMPARISONS:
        usable = [(r, held) for r, held in results if a in r.get("scores", {}) and b in r.get("scores", {})]
        for r, held in usable:
            d = paired_difference([(held, r["scores"][a], r["scores"][b])], r.get("seed", 0))
            print(f"| {a} - {b} | {r.get('seed')} | {d['pairs']} | {d['difference']:+.4f} | {d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f} |")
        if len(usable) > 1:
            d = paired_difference([(held, r["scores"][a], r["scores"][b]) for r, held in usable], 0)
            seeds = ",".join(str(r.get("seed")) for r, _ in usable)
            print(f"| {a} - {b} | pooled ({seeds}) | {d['pairs']} | {d['difference']:+.4f} | {d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f} |")
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--archive", help="an evo archive (read only)")
    ap.add_argument("--compare", nargs="+", metavar="JSON", help="saved results (--json): paired differences only")
    ap.add_argument("--holdout", type=float, default=0.34, help="share of the shapes held out (default 0.34)")
    ap.add_argument("--seed", type=int, default=0, help="the split's and training's seed (default 0)")
    ap.add_argument("--steps", type=int, default=64, help="evo rl rank steps for the trained LLM (default 64)")
    ap.add_argument("--device", default="cpu", help="where the LLM runs (default cpu)")
    ap.add_argument("--no-llm", action="store_true", help="only the random and tabular rankers")
    ap.add_argument("--reuse-llm", metavar="JSON", help="take the LLM rows from a saved result of the same split "
                    "(same archive, seed and holdout; checked group by group) instead of running the model")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(args.compare)
    if not args.archive:
        print("ranker_offline: --archive (or --compare) is required", file=sys.stderr)
        return 2
    if not 0 < args.holdout < 1 or args.steps < 1:
        print("ranker_offline: --holdout in (0, 1) and --steps >= 1", file=sys.stderr)
        return 2
    templates = load_templates(errors="warn")
    try:
        archive = Archive(args.archive, mode="r")
    except (ArchiveError, OSError) as exc:
        print(f"ranker_offline: --archive {args.archive}: {exc}", file=sys.stderr)
        return 2
    t0 = time.time()
    with archive:
        rows, _ = export_pairs([archive], templates=templates)
        groups, left = rank_groups(rows, templates)
        train, held = split_groups(groups, args.holdout, args.seed)
        if not train or not held:
            print(f"ranker_offline: {len(groups)} groups over {len({g.shape for g in groups})} shapes: "
                  "too few to hold shapes out", file=sys.stderr)
            return 2
        print(f"{len(rows)} pairs, {len(groups)} groups ({len(train)} train, {len(held)} held out over "
              f"{len({g.shape for g in held})} shapes); left out {left}", flush=True)
        result: dict[str, Any] = {"archive": str(args.archive), "pairs": len(rows), "seed": args.seed,
                                  "holdout": args.holdout, "train_groups": len(train), "held_out_groups": len(held),
                                  "held_out_shapes": sorted({g.shape for g in held}), "rankers": {}}
        rng = random.Random(args.seed)
        draws = [ranking_metrics(held, [[rng.random() for _ in g.edits] for g in held]) for _ in range(50)]
        result["rankers"]["random"] = {k: (round(sum(d[k] for d in draws) / len(draws), 4)
                                           if isinstance(draws[0][k], float) else draws[0][k]) for k in draws[0]}
        scored: dict[str, list[list[float]]] = {}
        tab = _tabular_scores(archive, {g.shape for g in train}, held)
        if tab is not None:
            scored["tabular"] = tab
    if args.reuse_llm:
        why = _reuse_llm(args.reuse_llm, held, args, scored, result)
        if why:
            print(f"ranker_offline: --reuse-llm {args.reuse_llm}: {why}", file=sys.stderr)
            return 2
    elif not args.no_llm:
        from evo.rl import Policy, score_groups, train_ranker
        from operators.llm import DEFAULT_MODEL, load_backend

        policy = Policy(load_backend(DEFAULT_MODEL, args.device), seed=args.seed)
        scored["llm base"] = score_groups(policy, held, base=True)
        history = train_ranker(policy, train, RankConfig(steps=args.steps, seed=args.seed),
                               log=lambda m: print(m, flush=True))
        scored["llm ranked"] = score_groups(policy, held)
        result["llm_steps"] = len(history)
    for name, scores in scored.items():
        result["rankers"][name] = {**ranking_metrics(held, scores), "ci95": _interval(held, scores, args.seed)}
    result["differences"] = {f"{a} - {b}": paired_difference([(held, scored[a], scored[b])], args.seed)
                             for a, b in COMPARISONS if a in scored and b in scored}
    result["scores"] = scored  # per held-out group, as the edits
    result["groups"] = [{"key": g.key, "shape": g.shape, "gains": [None if x == float("-inf") else x for x in g.gains]}
                        for g in held]
    result["seconds"] = round(time.time() - t0, 1)
    print("| ranker | held-out pairs | pairwise accuracy (95% interval, groups resampled) | Spearman (groups) | top-1 |")
    print("|---|---:|---:|---:|---:|")
    for name, m in result["rankers"].items():
        ci = m.get("ci95")
        print(f"| {name} | {m['pairs']} | {m['pairwise_accuracy']}" + (f" ({ci[0]}-{ci[1]})" if ci else "")
              + f" | {m['spearman']} ({m['spearman_groups']}) | {m['top1']} |")
    for name, d in result["differences"].items():
        print(f"paired: {name} {d['difference']:+.4f} (95% interval {d['ci95'][0]:+.4f} to {d['ci95'][1]:+.4f}, {d['pairs']} pairs)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
