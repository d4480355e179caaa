"""Group-relative policy optimisation (GRPO) of the LoRA policy on knob-edit prompts.

Each step takes one prompt (a parent at a shape, from the dataset's groups), samples
``group_size`` completions with the operator's constrained decoding, scores each (the archive
when the completion's knob set was measured there, else the evaluator callback when one is
given (the GPU path), else ``RewardConfig.unmapped``), turns the rewards into group-relative
advantages ((r - mean) / std; a group whose rewards are all equal teaches nothing and is
skipped), and takes ``inner`` optimiser steps on the clipped policy-gradient loss with a k3 KL
estimate against the reference (the adapter disabled)::

    loss = mean_samples mean_steps [ -min(rho A, clip(rho, 1-eps, 1+eps) A) + beta (exp(q) - q - 1) ],
    rho = exp(logp - logp_old),  q = logp_ref - logp

The KL term is taken over the sampled completions only: k3 is an estimate of KL(policy || ref)
for completions drawn from the policy. On a replayed (off-policy) completion that the policy has
moved away from and the reference still likes (the base model's own TM=64 answers), q is large
and exp(q) explodes: the device run before this change logged a mean "KL" of 1,442 at step 5,
and its gradient (clipped to the same norm as the advantage term's) pulled the policy back.

Each step's group also holds up to ``replay`` of the archive's own completions for the prompt
(the dataset rows of its group, re-traced through the same grammar with the current weights):
on-policy sampling alone never finds a value the base model gives ~0 probability (measured:
the base answers TM=64 to this prompt nearly always, even at temperature 2, and every group had
equal rewards), while the archive holds completions that paid; with one inner step their term
is a reward-weighted likelihood (advantage-weighted regression) on the elites and failures.

Only knob-mode groups (a template candidate's parent with knobs) are trainable offline; others
are counted and skipped. Everything is seeded: the same seed, data and model give the same
adapter (on one machine and thread count).
"""
from __future__ import annotations

import json
import random
import statistics
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence, TypeVar

from operators.llm import PREFIX, KnobEditGrammar, parse_knob_edit
from populations import Candidate, Evaluation, Shape, Template, TemplateError

from ._policy import Policy
from ._reward import RewardConfig, RewardTable

__all__ = ["GRPOConfig", "Prompt", "RewardSource", "prompts_from_rows", "add_elite_demos", "cycled", "train"]

T = TypeVar("T")
Evaluate = Callable[[Candidate], Sequence[Evaluation]]


@dataclass(frozen=True)
class GRPOConfig:
    """Training settings (stored in every adapter's manifest)."""

    steps: int = 8
    group_size: int = 8
    lr: float = 2e-3
    beta: float = 0.02
    clip: float = 0.2
    inner: int = 1
    temperature: float = 1.0
    max_changes: int = 2
    max_grad_norm: float = 1.0
    replay: int = 8          # archived completions of the group added to each step's samples (0: none)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.steps < 0 or self.group_size < 2 or self.inner < 1 or self.max_changes < 1:
            raise ValueError("steps >= 0, group_size >= 2, inner >= 1 and max_changes >= 1 are needed")
        if not (self.lr > 0 and self.beta >= 0 and 0 < self.clip < 1 and self.temperature > 0):
            raise ValueError("lr > 0, beta >= 0, 0 < clip < 1 and temperature > 0 are needed")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Prompt:
    """A trainable group: the chat for one parent at one shape and what its grammar needs."""

    group: str
    messages: list[dict[str, str]]
    template: Template
    parent_knobs: Mapping[str, Any]
    shape: Shape
    generic: bool = False
    replay: tuple[str, ...] = ()  # the group's archived completions (texts)


def prompts_from_rows(rows: Iterable[Mapping[str, Any]], templates: Mapping[str, Template]) -> tuple[list[Prompt], Counter]:
    """One :class:`Prompt` per group of knob-mode rows whose template is loaded; and why others were skipped."""
    seen: dict[str, Prompt] = {}
    skipped: Counter = Counter()
    texts: dict[str, list[str]] = {}
    for r in rows:
        group = r.get("group", "-")
        completion = r.get("completion")
        text = completion[0].get("content") if isinstance(completion, list) and completion else completion
        if isinstance(text, str) and text not in texts.setdefault(group, []):
            texts[group].append(text)
        if group in seen:
            continue
        if not r.get("template") or r.get("parent_knobs") is None:
            skipped["not a knob edit of a template parent"] += 1
            continue
        template = templates.get(r["template"])
        if template is None:
            skipped[f"template {r['template']} not loaded"] += 1
            continue
        try:
            shape = Shape.parse(r["shape"])
            knobs = template.space.complete(r["parent_knobs"])
        except (ValueError, TemplateError) as exc:
            skipped[f"bad row: {exc}"[:80]] += 1
            continue
        seen[group] = Prompt(group, list(r["prompt"]), template, knobs, shape, bool(r.get("generic", False)))
    return [Prompt(**{**p.__dict__, "replay": tuple(texts.get(g, ()))}) for g, p in seen.items()], skipped


def add_elite_demos(prompts: Sequence[Prompt], archive: Any, table: RewardTable, top: int = 4,
                    max_changes: int = 2) -> list[Prompt]:
    """``prompts`` with the archive's best children of each group's parent added to its replay
    texts: candidates of the parent's template at the group's shape whose first parent is the
    group's parent and that change at most ``max_changes`` knobs, written as the JSON knob edit
    the operator would have answered, best ``top`` by reward (whatever operator made them: the
    elite archive teaches the LLM what paid)."""
    out = []
    for p in prompts:
        parent_id = p.group.split("|")[0]
        found = []
        for c in archive.candidates(p.shape):
            if not c.parents or c.parents[0] != parent_id or c.template != p.template.name or c.knobs is None:
                continue
            changed = {k: v for k, v in c.knobs.items() if p.parent_knobs.get(k) != v}
            r = table.get(p.shape, c.id)
            if 1 <= len(changed) <= max_changes and r is not None:
                found.append((r, PREFIX + json.dumps(changed)[2:]))
        texts = [t for _r, t in sorted(found, key=lambda x: -x[0])[:top] if t not in p.replay]
        out.append(Prompt(**{**p.__dict__, "replay": p.replay + tuple(texts)}))
    return out


class RewardSource:
    """Completion text -> (reward, source, candidate id): archive, evaluator or penalty."""

    def __init__(self, table: RewardTable, evaluate: Optional[Evaluate] = None,
                 evaluate_many: Optional[Callable[[list[Candidate]], Sequence[Sequence[Evaluation]]]] = None) -> None:
        self.table = table
        self.evaluate = evaluate
        self.evaluate_many = evaluate_many
        self.config: RewardConfig = table.config
        self.sources: Counter = Counter()
        self._fresh: set[tuple[Shape, str]] = set()

    def prefetch(self, prompt: Prompt, texts: Sequence[str]) -> None:
        """Evaluate in one call (``evaluate_many``: a pool compiles and times them side by side)
        the distinct candidates of ``texts`` the table has no reward for; a no-op without it."""
        if self.evaluate_many is None:
            return
        todo: dict[str, Candidate] = {}
        for text in texts:
            cand = self.candidate(prompt, text)
            if cand is not None and self.table.get(prompt.shape, cand.id) is None:
                todo[cand.id] = cand
        if not todo:
            return
        for cand, evals in zip(todo.values(), self.evaluate_many(list(todo.values()))):
            if self._record(prompt, evals, cand.id) is None:
                self.table.set(prompt.shape, cand.id, self.config.unmapped)
            self._fresh.add((prompt.shape, cand.id))

    def _record(self, prompt: Prompt, evals: Sequence[Evaluation], cand_id: str) -> Optional[float]:
        """Add the evaluations at the prompt's shape to the table; their reward (None: none usable)."""
        here = [e for e in evals if e.shape == prompt.shape]
        for e in here:
            self.table.add(e)
        return self.table.get(prompt.shape, cand_id) if here else None

    def candidate(self, prompt: Prompt, text: str) -> Optional[Candidate]:
        parsed = parse_knob_edit(text, prompt.template, prompt.parent_knobs, prompt.shape)
        if not parsed.ok:
            return None
        try:
            cand = prompt.template.candidate(parsed.value, prompt.shape, not prompt.generic)
        except (TemplateError, ValueError):
            return None
        self.table.set_parent(prompt.shape, cand.id, prompt.group.split("|")[0])  # improvement rewards
        return cand

    def candidate_reward(self, prompt: Prompt, cand: Candidate) -> Optional[float]:
        """The reward of a proposed candidate at the prompt's shape (archive, else the evaluator)."""
        return self._reward(prompt, cand)[0]

    def __call__(self, prompt: Prompt, text: str) -> tuple[float, str, Optional[str]]:
        cand = self.candidate(prompt, text)
        if cand is None:
            self.sources["unparsed"] += 1
            return self.config.unmapped, "unparsed", None
        return self._reward(prompt, cand)

    def _reward(self, prompt: Prompt, cand: Candidate) -> tuple[float, str, Optional[str]]:
        r = self.table.get(prompt.shape, cand.id)
        if r is not None:
            source = "evaluator" if (prompt.shape, cand.id) in self._fresh else "archive"
            self._fresh.discard((prompt.shape, cand.id))
            self.sources[source] += 1
            return r, source, cand.id
        if self.evaluate is not None:
            r = self._record(prompt, self.evaluate(cand), cand.id)
            if r is not None:
                self.sources["evaluator"] += 1
                return r, "evaluator", cand.id
        self.sources["penalty"] += 1
        return self.config.unmapped, "penalty", cand.id


def cycled(items: Sequence[T], steps: int, rng: random.Random, deadline: Optional[float] = None,
           log: Optional[Callable[[str], None]] = None, what: str = "rl") -> Iterator[tuple[int, T]]:
    """(step, item) for ``steps`` steps over ``items`` cycled, each cycle in a new order drawn from
    ``rng``; no step starts after ``deadline`` (a time.monotonic() value), which ``log`` is told."""
    order: list[T] = []
    for step in range(steps):
        if deadline is not None and time.monotonic() >= deadline:
            if log:
                log(f"{what}: time is up after {step} of {steps} steps")
            return
        if not order:
            order = list(items)
            rng.shuffle(order)
        yield step, order.pop()


def train(policy: Policy, prompts: Sequence[Prompt], rewards: RewardSource, config: GRPOConfig,
          log: Optional[Callable[[str], None]] = None, deadline: Optional[float] = None) -> list[dict[str, Any]]:
    """Run ``config.steps`` GRPO steps over ``prompts`` (cycled in a seeded order); one record per
    step. With ``deadline`` (a time.monotonic() value) no step starts after it."""
    torch = policy.torch
    if not prompts:
        raise ValueError("no trainable prompts (knob-edit groups of loaded templates) in the data")
    rng = random.Random(config.seed)
    torch.manual_seed(config.seed)
    opt = torch.optim.Adam(policy.trainable(), lr=config.lr)
    history: list[dict[str, Any]] = []
    for step, prompt in cycled(prompts, config.steps, rng, deadline, log, "rl"):
        start = time.perf_counter()
        ids = policy.prompt_ids(prompt.messages)
        samples = []
        for _ in range(config.group_size):
            grammar = KnobEditGrammar(prompt.template, prompt.parent_knobs, prompt.shape, config.max_changes)
            samples.append(policy.sample(prompt.messages, grammar, rng, config.temperature))
        rewards.prefetch(prompt, [s.text for s in samples if s.finished])  # new edits evaluated side by side
        scores = [rewards(prompt, s.text)[0] if s.finished else rewards.config.unmapped for s in samples]
        replayed = list(prompt.replay)
        rng.shuffle(replayed)
        for text in replayed[:config.replay]:  # the archive's own completions for this group
            grammar = KnobEditGrammar(prompt.template, prompt.parent_knobs, prompt.shape, config.max_changes)
            s = policy.replay(prompt.messages, grammar, text, config.temperature)
            if s is not None:
                samples.append(s)
                scores.append(rewards(prompt, s.text)[0])
        mean = statistics.fmean(scores)
        std = statistics.pstdev(scores)
        sampled = scores[:config.group_size]
        record: dict[str, Any] = {"step": step, "group": prompt.group, "reward_mean": statistics.fmean(sampled),
                                  "reward_std": std, "replayed": len(samples) - config.group_size,
                                  "completions": [s.text for s in samples], "rewards": scores}
        if std > 1e-8:
            adv = [(r - mean) / std for r in scores]
            n_sampled = config.group_size  # the KL term only on these (see the module docstring)
            ref = ([policy.logprobs(ids, s, reference=True) if i < n_sampled else None for i, s in enumerate(samples)]
                   if config.beta > 0 else [None] * len(samples))
            old: list[Any] = [None] * len(samples)
            losses, kls = [], []
            for it in range(config.inner):
                with policy.leased():  # one slice of the timing GPU's lease per optimiser step
                    opt.zero_grad()
                    total = 0.0
                    live = [i for i, s in enumerate(samples) if s.steps]
                    for i in live:
                        lp = policy.logprobs(ids, samples[i])
                        if it == 0:
                            old[i] = lp.detach()
                        ratio = torch.exp(lp - old[i])
                        a = adv[i]
                        loss = -torch.min(ratio * a, torch.clamp(ratio, 1 - config.clip, 1 + config.clip) * a)
                        if ref[i] is not None:  # sampled completions only (ref is None for replayed ones)
                            q = ref[i] - lp
                            kl = torch.exp(q) - q - 1
                            loss = loss + config.beta * kl
                            kls.append(float(kl.detach().mean()))
                        loss = loss.mean() / len(live)
                        loss.backward()
                        total += float(loss.detach())
                    torch.nn.utils.clip_grad_norm_(policy.trainable(), config.max_grad_norm)
                    opt.step()
                    policy.weights_changed()
                losses.append(total)
            record.update(loss=losses[-1], kl=statistics.fmean(kls) if kls else 0.0)
        else:
            record.update(loss=None, kl=None, skipped="equal rewards")
        record["seconds"] = round(time.perf_counter() - start, 3)
        history.append(record)
        if log:
            log(f"rl step {step + 1}/{config.steps}: sampled reward mean {record['reward_mean']:+.3f}, group std {std:.3f}"
                f" ({record['replayed']} replayed)"
                + (f", loss {record['loss']:+.4f}, kl {record['kl']:.4f}" if record.get("loss") is not None
                   else " (skipped: equal rewards)") + f", {record['seconds']:.1f}s")
    return history
