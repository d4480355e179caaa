"""Supervised training of the LLM as a ranker of knob edits, on ``evo rl export --pairs`` data (issue 35).

The LLM cost model (:class:`operators.llm.LLMScorer`) scores a child by the summed log-likelihood
of its knob edit after the mutation prompt for its parent at the shape. Zero-shot that ranks no
better than chance; this module teaches it from every measured parent-child pair of every
operator, before (or instead of) GRPO:

- a **group** is one parent at one shape (the pairs' ``group`` key): its children share the prompt,
  and the ranking step only ever compares children of one parent, so the loss compares within a
  group and never across prompts;
- ``pairwise`` (default): a RankNet loss, ``softplus(-(s_i - s_j) / temperature)`` over every
  ordered pair whose measured log-gains differ by more than ``min_gap`` (a failed child ranks
  below every child that ran), plus ``sft`` times the length-normalised negative log-likelihood
  of the group's best child where it gained (so the adapter still proposes what it now ranks
  high);
- ``weighted``: reward-weighted likelihood (each child's normalised log-likelihood weighted by its
  share of the group's positive rewards), the plain SFT baseline to compare with.

The score is exactly the scorer's (the prompt's chat template without the decoding prefix, the
edit as :func:`operators.llm.scored_edit` writes it, the full-vocabulary softmax), so what is trained
is what ranks. As in the GRPO policy, the prompt's KV cache is computed without gradient under
the current weights and each group's children run as one right-padded teacher-forced pass over
it; the gradient flows through the edit tokens only.

Groups are split by **shape** into train and held-out (``holdout``: a share of the shapes, drawn
with the seed), and :func:`ranking_metrics` scores both before and after training, with the
base model and with the adapter, through the same scoring path: pairwise accuracy (ordered
pairs ranked right, ties of score counted half) and the mean Spearman correlation over groups of
at least three distinct outcomes.
"""
from __future__ import annotations

import contextlib
import copy
import math
import random
import statistics
import time
import warnings
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from populations import Template

from ._grpo import cycled

__all__ = ["RankConfig", "RankGroup", "spearman", "rank_groups", "split_groups", "ranking_metrics", "score_groups", "train_ranker", "train_rank_adapter"]

#: log-gain given to a failed child: below every child that ran (ranking only compares)
FAILED = -math.inf


@dataclass(frozen=True)
class RankConfig:
    """Settings of :func:`train_ranker` (module docstring)."""

    steps: int = 64
    lr: float = 5e-4
    seed: int = 0
    loss: str = "pairwise"
    temperature: float = 1.0
    min_gap: float = 0.02
    sft: float = 0.1
    holdout: float = 0.25
    max_children: int = 16
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.loss not in ("pairwise", "weighted"):
            raise ValueError(f"loss must be 'pairwise' or 'weighted', got {self.loss!r}")
        if self.steps < 1 or self.max_children < 2:
            raise ValueError("steps must be >= 1 and max_children >= 2")
        if not 0.0 <= self.holdout < 1.0:
            raise ValueError(f"holdout must be in [0, 1), got {self.holdout!r}")
        if self.temperature <= 0 or self.lr <= 0 or self.min_gap < 0 or self.sft < 0:
            raise ValueError("temperature and lr must be > 0, min_gap and sft >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ordered_pairs(gains: Sequence[float], min_gap: float) -> list[tuple[int, int]]:
    """Index pairs (better, worse) of ``gains`` that differ by more than ``min_gap`` (a failure,
    ``FAILED``, is below every other outcome whatever the gap)."""
    return [(i, j) for i, gi in enumerate(gains) for j, gj in enumerate(gains)
            if gi > gj and (gj == FAILED or gi - gj > min_gap)]


@dataclass(frozen=True)
class RankGroup:
    """One parent at one shape: the prompt and its children's edits with their measured log-gains
    (``FAILED`` for a child that did not run)."""

    key: str
    shape: str
    messages: tuple[Mapping[str, str], ...]
    edits: tuple[str, ...]
    gains: tuple[float, ...]
    operators: tuple[str, ...] = field(default=())
    candidates: tuple[str, ...] = field(default=())  # the children's ids, as the edits
    parent: str = ""

    def pairs(self, min_gap: float) -> list[tuple[int, int]]:
        """Ordered pairs (better, worse) whose outcomes differ by more than ``min_gap``."""
        return ordered_pairs(self.gains, min_gap)


def rank_groups(rows: Sequence[Mapping[str, Any]], templates: Mapping[str, Template]) -> tuple[list[RankGroup], dict[str, int]]:
    """Groups of ``evo rl export --pairs`` rows with at least two children of different outcomes;
    and the count, by reason, of rows left out. A child that appears twice in a group (the same
    knobs proposed again) keeps its first measurement."""
    from operators.llm import scored_edit

    by_group: dict[str, list[Mapping[str, Any]]] = {}
    left: Counter = Counter()
    for r in rows:
        template = templates.get(r.get("template", ""))
        if template is None or not isinstance(r.get("knobs"), Mapping) or not isinstance(r.get("parent_knobs"), Mapping):
            left["not a knob edit of a loaded template"] += 1
            continue
        by_group.setdefault(str(r["group"]), []).append(r)
    groups = []
    for key, members in by_group.items():
        template = templates[members[0]["template"]]
        seen: dict[str, float] = {}
        ops: dict[str, str] = {}
        ids: dict[str, str] = {}
        for r in members:
            edit = scored_edit(template, r["parent_knobs"], r["knobs"])
            if edit in seen or edit == "{}":
                left["a repeated or empty edit"] += 1
                continue
            seen[edit] = FAILED if r.get("log_gain") is None else float(r["log_gain"])
            ops[edit] = str(r.get("operator") or "")
            ids[edit] = str(r.get("candidate") or "")
        if len(set(seen.values())) < 2:
            left["a group without two outcomes to compare"] += len(seen)
            continue
        edits = tuple(seen)
        groups.append(RankGroup(key=key, shape=str(members[0]["shape"]), messages=tuple(members[0]["prompt"]),
                                edits=edits, gains=tuple(seen[e] for e in edits), operators=tuple(ops[e] for e in edits),
                                candidates=tuple(ids[e] for e in edits), parent=str(members[0].get("parent") or "")))
    groups.sort(key=lambda g: g.key)
    return groups, dict(left)


def split_groups(groups: Sequence[RankGroup], holdout: float, seed: int) -> tuple[list[RankGroup], list[RankGroup]]:
    """(train, held out): whole shapes held out, ``holdout`` of them (at least one where there are
    two shapes or more and ``holdout`` > 0), drawn with ``seed``."""
    shapes = sorted({g.shape for g in groups})
    random.Random(seed).shuffle(shapes)
    n = 0 if holdout <= 0 or len(shapes) < 2 else max(1, min(len(shapes) - 1, round(holdout * len(shapes))))
    held = set(shapes[:n])
    return [g for g in groups if g.shape not in held], [g for g in groups if g.shape in held]


def spearman(a: Sequence[float], b: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation (average ranks for ties); None where either side is constant."""
    def ranks(x: Sequence[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        out = [0.0] * len(x)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out
    ra, rb = ranks(a), ranks(b)
    if len(set(ra)) < 2 or len(set(rb)) < 2:
        return None
    return statistics.correlation(ra, rb)


def pairwise_counts(groups: Sequence[RankGroup], scores: Sequence[Sequence[float]],
                    min_gap: float = 0.0) -> tuple[float, int]:
    """Ordered pairs of :meth:`RankGroup.pairs` that ``scores`` put in order (a tie of scores
    counts half), and how many pairs there are."""
    right, total = 0.0, 0
    for g, s in zip(groups, scores):
        for i, j in g.pairs(min_gap):
            total += 1
            right += 1.0 if s[i] > s[j] else 0.5 if s[i] == s[j] else 0.0
    return right, total


def ranking_metrics(groups: Sequence[RankGroup], scores: Sequence[Sequence[float]], min_gap: float = 0.0) -> dict[str, Any]:
    """How well ``scores`` (one list per group, one score per edit) order the measured outcomes:
    pairwise accuracy over the ordered pairs of :meth:`RankGroup.pairs` (a tie of scores counts
    half), the mean Spearman correlation over groups with at least three distinct outcomes
    (failures rank as the lowest), and how often the group's top-scored child is its best (within
    ``min_gap``)."""
    right, total = pairwise_counts(groups, scores, min_gap)
    rhos, top = [], []
    for g, s in zip(groups, scores):
        finite = [x if x != FAILED else -1e9 for x in g.gains]
        if len(set(finite)) >= 3:
            rho = spearman(finite, s)
            if rho is not None:
                rhos.append(rho)
        best = max(finite)  # the top-scored child counts when it is within min_gap of the best
        top.append(1.0 if finite[max(range(len(s)), key=lambda i: s[i])] >= best - min_gap else 0.0)
    return {"groups": len(groups), "pairs": int(total),
            "pairwise_accuracy": round(right / total, 4) if total else None,
            "spearman": round(statistics.fmean(rhos), 4) if rhos else None, "spearman_groups": len(rhos),
            "top1": round(statistics.fmean(top), 4) if top else None}


class _Scorer:
    """The scorer's log-likelihood of a group's edits under the policy's model, with gradient
    (``grad``) or without; ``base`` scores with the adapter disabled (the base model). Without
    gradient the last group's prompt cache is kept for its next rows: make a new one after the
    weights change."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.torch = policy.torch
        self.tok = policy.backend.tokenizer
        eos = policy.backend.eos
        self.pad = next(iter(eos)) if eos else 0
        self._ids: dict[str, list[int]] = {}
        self._past: dict[tuple[str, bool], Any] = {}  # the last group's prompt cache, for scoring without gradient

    def prompt_ids(self, group: RankGroup) -> list[int]:
        if group.key not in self._ids:  # the scorer's prompt: the chat template, no decoding prefix
            self._ids[group.key] = self.policy.backend.prompt_ids([dict(m) for m in group.messages])
        return self._ids[group.key]

    def __call__(self, group: RankGroup, *, grad: bool, base: bool = False, rows: Optional[Sequence[int]] = None) -> Any:
        """Summed log-probabilities (a 1-d tensor) of the edits at ``rows`` (default all), and
        their token counts."""
        torch, model = self.torch, self.policy.model
        rows = list(range(len(group.edits))) if rows is None else list(rows)
        seqs = [self.tok.encode(group.edits[i], add_special_tokens=False) for i in rows]
        ids = self.prompt_ids(group)
        device = self.policy.sampler.device
        adapter = model.disable_adapter() if base else contextlib.nullcontext()
        with self.policy.leased(), adapter, warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            past = self._past.get((group.key, base)) if not grad else None
            if past is None:
                with torch.no_grad():  # the prompt without gradient, under the current weights
                    past = model(input_ids=torch.tensor([ids[:-1]], device=device), use_cache=True,
                                 logits_to_keep=1).past_key_values
                if not grad:  # scoring only: the weights stay, so the group's next rows reuse it
                    self._past = {(group.key, base): past}
            past = copy.deepcopy(past)
            if len(seqs) > 1:
                past.batch_repeat_interleave(len(seqs))
            width = max(len(s) for s in seqs)
            x = torch.tensor([ids[-1:] + s + [self.pad] * (width - len(s)) for s in seqs], device=device)
            with (torch.enable_grad() if grad else torch.no_grad()):
                logits = model(input_ids=x, past_key_values=past, use_cache=True).logits.float()
                lp = torch.log_softmax(logits, dim=-1)
                out = []
                for r, s in enumerate(seqs):
                    target = torch.tensor(s, device=device)
                    out.append(lp[r, :len(s)].gather(1, target[:, None]).sum())
                scores = torch.stack(out)
        return scores, torch.tensor([len(s) for s in seqs], dtype=scores.dtype, device=scores.device)


def _group_loss(torch: Any, group: RankGroup, rows: Sequence[int], s: Any, lengths: Any, config: RankConfig) -> Optional[Any]:
    gains = [group.gains[i] for i in rows]
    if config.loss == "weighted":
        rewards = [max(0.0, g) if g != FAILED else 0.0 for g in gains]
        total = sum(rewards)
        if total <= 0:
            return None
        w = torch.tensor([r / total for r in rewards], dtype=s.dtype, device=s.device)
        return -(w * s / lengths).sum()
    pairs = ordered_pairs(gains, config.min_gap)
    if not pairs:
        return None
    better = torch.tensor([i for i, _ in pairs], device=s.device)
    worse = torch.tensor([j for _, j in pairs], device=s.device)
    loss = torch.nn.functional.softplus(-(s[better] - s[worse]) / config.temperature).mean()
    best = max(range(len(rows)), key=lambda i: gains[i])
    if config.sft > 0 and gains[best] != FAILED and gains[best] > 0:
        loss = loss - config.sft * s[best] / lengths[best]
    return loss


def score_groups(policy: Any, groups: Sequence[RankGroup], *, base: bool = False, rows_per_pass: int = 16) -> list[list[float]]:
    """Every group's edits scored as the LLM scorer scores them, without gradient, ``rows_per_pass``
    at a time (each row copies the prompt's KV cache: about 55 MB a row at 1,200 tokens)."""
    scorer = _Scorer(policy)
    out = []
    for g in groups:
        scores: list[float] = []
        for at in range(0, len(g.edits), rows_per_pass):
            rows = range(at, min(at + rows_per_pass, len(g.edits)))
            scores += [float(x) for x in scorer(g, grad=False, base=base, rows=rows)[0]]
        out.append(scores)
    return out


def train_ranker(policy: Any, train: Sequence[RankGroup], config: RankConfig,
                 log: Optional[Callable[[str], None]] = None, deadline: Optional[float] = None) -> list[dict[str, Any]]:
    """``config.steps`` optimiser steps, one group a step (cycled in a seeded order; a group of more
    than ``max_children`` children gives a seeded sample of them each time); one record per step.
    With ``deadline`` (a time.monotonic() value) no step starts after it."""
    torch = policy.torch
    if config.loss == "pairwise":  # a group whose outcomes all lie within min_gap has nothing to teach
        train = [g for g in train if g.pairs(config.min_gap)]
    if not train:
        raise ValueError("no groups to train on (a parent at a shape with two children of different outcomes)")
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    opt = torch.optim.Adam(policy.trainable(), lr=config.lr)
    scorer = _Scorer(policy)
    history: list[dict[str, Any]] = []
    for step, group in cycled(train, config.steps, rng, deadline, log, "rank"):
        rows = list(range(len(group.edits)))
        if len(rows) > config.max_children:
            rows = sorted(rng.sample(rows, config.max_children))
        start = time.perf_counter()
        with policy.leased():
            opt.zero_grad()
            s, lengths = scorer(group, grad=True, rows=rows)
            loss = _group_loss(torch, group, rows, s, lengths, config)
            if loss is not None:
                loss.backward()
                torch.nn.utils.clip_grad_norm_(policy.trainable(), config.max_grad_norm)
                opt.step()
        record = {"step": step, "group": group.key, "children": len(rows),
                  "loss": round(float(loss.detach()), 5) if loss is not None else None,
                  "seconds": round(time.perf_counter() - start, 3)}
        history.append(record)
        if log:
            log(f"rank step {step + 1}/{config.steps}: {len(rows)} children, "
                + (f"loss {record['loss']:+.4f}" if loss is not None else "nothing to compare")
                + f", {record['seconds']:.1f}s")
    return history


def train_rank_adapter(rows: Sequence[Mapping[str, Any]], out: Any, *, policy: Any, templates: Mapping[str, Template],
                       config: RankConfig = RankConfig(), version: int = 1, parent_adapter: Optional[str] = None,
                       log: Optional[Callable[[str], None]] = None, deadline: Optional[float] = None) -> tuple[Any, dict[str, Any]]:
    """Train ``policy`` as a ranker on pair ``rows`` (:func:`train_ranker`), save the adapter into
    ``out`` with its manifest, and return the manifest and the ranking report: the metrics of the
    held-out and training groups before (the starting weights) and after. ValueError when the rows
    hold no group to train on."""
    from ._adapters import _rows_digest, version_name
    from ._manifest import AdapterManifest

    groups, left = rank_groups(rows, templates)
    train, held = split_groups(groups, config.holdout, config.seed)
    if not train:
        raise ValueError("no group to train on: the pairs need a parent at a shape with two children of different "
                         f"outcomes ({len(rows)} rows; left out: {left or 'none'})")
    start = time.time()
    report: dict[str, Any] = {"train_shapes": sorted({g.shape for g in train}),
                              "held_out_shapes": sorted({g.shape for g in held})}
    for name, part in (("held_out", held), ("train", train)):
        if part:
            report[f"{name}_before"] = ranking_metrics(part, score_groups(policy, part), config.min_gap)
            if log:
                log(f"rank: before training, {name.replace('_', '-')}: {report[f'{name}_before']}")
    history = train_ranker(policy, train, config, log=log, deadline=deadline)
    for name, part in (("held_out", held), ("train", train)):
        if part:
            report[f"{name}_after"] = ranking_metrics(part, score_groups(policy, part), config.min_gap)
            if log:
                log(f"rank: after training, {name.replace('_', '-')}: {report[f'{name}_after']}")
    digest = policy.save(out)
    manifest = AdapterManifest(
        version=version, name=version_name(version, digest), seed=config.seed, base_model=policy.backend.name,
        base_model_hash=policy.base_hash, adapter_hash=digest, parent_adapter=parent_adapter,
        config={"rank": config.to_dict(), **policy.settings()},
        dataset={"rows": len(rows), "groups": len(groups), "train_groups": len(train), "held_out_groups": len(held),
                 "left_out": dict(left), "sha256": _rows_digest(rows)},
        train_seconds=round(time.time() - start, 2), metrics=tuple(history), created=time.time(),
        extra={"ranking": report})
    manifest.write(out)
    return manifest, report
