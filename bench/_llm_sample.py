"""Which shapes of ``llm_layers.csv`` the issue-26 benchmark runs, and the classes they are in.

Classes (issue 26), tested on (M, N, K) alone:

| class | rule |
|---|---|
| ``decode`` | M <= 16 |
| ``m17_128`` | 17 <= M <= 128 |
| ``m129_1024`` | 129 <= M <= 1024 |
| ``m2048`` | M >= 2048 |
| ``small`` | 2MNK < 1e8 |
| ``misaligned`` | N % 8 != 0 or K % 8 != 0 |

**Counting**: a shape is in every class whose rule it meets (1x576x576 is ``decode`` and
``small``); a class's count is the shapes in it, and the sample's total counts each shape once.

The pool sampled from: the CSV's rows (one per distinct M, N, K; the first model and layer
named), plus the M=8 rows again at M=16 when the CSV has no M=16 row (issue 26's decode range
is M <= 16), plus, when fewer than ``per_class`` misaligned rows exist (the CSV has 4, all of
gpt2's lm_head N=50257), those rows at further token counts (:data:`EXTRA_M`, in that order).
Derived rows say so in ``origin``.

:func:`sample` is deterministic for a seed: classes are filled to ``per_class`` scarcest first,
each from a round-robin over strata (decode: M and weights under/over 8 MB; the others: model),
then the sample is topped up to ``total`` with a round-robin over (M class, model) strata.
"""
from __future__ import annotations

import csv
import itertools
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Hashable, Iterable, Sequence

__all__ = ["GemmRow", "Row", "CLASSES", "LABELS", "EXTRA_M", "classes_of", "read_rows", "candidate_pool", "sample",
           "class_counts", "waves", "interleave"]

CLASSES = ("decode", "m17_128", "m129_1024", "m2048", "small", "misaligned")
LABELS = {"decode": "decode (M <= 16)", "m17_128": "M 17-128", "m129_1024": "M 129-1024", "m2048": "M >= 2048",
          "small": "under 1e8 FLOP", "misaligned": "misaligned (N or K % 8 != 0)"}
#: token counts at which misaligned rows are added when the CSV has too few (prefill sizes first)
EXTRA_M = (16, 4096, 128, 2048, 32, 256, 1024, 2, 4)
BIG_WEIGHTS = 8 * 10**6  # bytes: the anchors' "weights >= 8 MB" split of decode rows


def classes_of(m: int, n: int, k: int) -> tuple[str, ...]:
    """Every class (of :data:`CLASSES`, in that order) the shape M x N x K is in."""
    out = []
    if m <= 16:
        out.append("decode")
    elif m <= 128:
        out.append("m17_128")
    elif m <= 1024:
        out.append("m129_1024")
    elif m >= 2048:
        out.append("m2048")
    if 2 * m * n * k < 1e8:
        out.append("small")
    if n % 8 or k % 8:
        out.append("misaligned")
    return tuple(out)


class GemmRow:
    """What the benchmarks' stages (``_bench_stages``) use of a row, for a frozen dataclass with
    fields ``m``, ``n``, ``k`` and ``classes``: its classes set from the subclass's
    ``classes_of(m, n, k)`` when it is made, the ``evo`` shape string, the key and sizes."""

    m: int
    n: int
    k: int
    classes: tuple[str, ...]

    @staticmethod
    def classes_of(m: int, n: int, k: int) -> tuple[str, ...]:
        raise NotImplementedError

    def __post_init__(self) -> None:
        object.__setattr__(self, "classes", self.classes_of(self.m, self.n, self.k))

    @property
    def shape(self) -> str:
        """The ``evo`` shape string (TN layout of nn.Linear, f32 contract)."""
        return f"{self.m}x{self.n}x{self.k}:TN:f32"

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    @property
    def weight_bytes(self) -> int:
        return 2 * self.n * self.k

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def base_dict(self) -> dict:
        """The fields every benchmark's ``to_dict`` starts with."""
        return {"shape": self.shape, "M": self.m, "N": self.n, "K": self.k, "classes": list(self.classes),
                "weight_mb": round(self.weight_bytes / 1e6, 3)}


@dataclass(frozen=True)
class Row(GemmRow):
    m: int
    n: int
    k: int
    model: str = ""
    layer: str = ""
    origin: str = "csv"
    classes: tuple[str, ...] = field(default=(), compare=False)
    classes_of = staticmethod(classes_of)

    @property
    def mclass(self) -> str:
        return next((c for c in self.classes if c.startswith(("decode", "m"))), "other")

    def to_dict(self) -> dict:
        return {**self.base_dict(), "model": self.model, "layer": self.layer, "origin": self.origin}

    @classmethod
    def from_dict(cls, d: dict) -> "Row":
        """The row :meth:`to_dict` wrote."""
        return cls(int(d["M"]), int(d["N"]), int(d["K"]), d.get("model", ""), d.get("layer", ""), d.get("origin", "csv"))


def read_rows(path: Path) -> list[Row]:
    """One row per distinct (M, N, K) of a CSV with M, N, K columns (model, layer optional)."""
    out, seen = [], set()
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            row = Row(int(r["M"]), int(r["N"]), int(r["K"]), (r.get("model") or "").strip(), (r.get("layer") or "").strip())
            if row.key not in seen:
                seen.add(row.key)
                out.append(row)
    if not out:
        raise ValueError(f"{path}: no rows with M, N, K")
    return out


def candidate_pool(rows: Sequence[Row], per_class: int = 8) -> list[Row]:
    """The CSV rows plus the derived ones described in the module docstring."""
    pool = list(rows)
    keys = {r.key for r in pool}

    def add(r: Row) -> None:
        if r.key not in keys:
            keys.add(r.key)
            pool.append(r)
    if not any(r.m == 16 for r in rows):
        for r in rows:
            if r.m == 8:
                add(Row(16, r.n, r.k, r.model, r.layer, f"M=16 of {r.m}x{r.n}x{r.k}"))
    mis = [r for r in pool if "misaligned" in r.classes]
    bases: dict = {}
    for r in mis:
        bases.setdefault((r.n, r.k), r)
    for m in EXTRA_M:
        if sum("misaligned" in r.classes for r in pool) >= per_class:
            break
        for (n, k), base in sorted(bases.items()):
            add(Row(m, n, k, base.model, base.layer, f"M={m} of {base.m}x{n}x{k}"))
    return pool


def _stratified(rows: Iterable[Row], rng: random.Random, key: Callable[[Row], Hashable]) -> list[Row]:
    """Rows in a round-robin over strata (strata in sorted order, rows shuffled within each)."""
    by: dict = defaultdict(list)
    for r in rows:
        by[key(r)].append(r)
    queues = [rng.sample(v, len(v)) for _, v in sorted(by.items(), key=lambda kv: str(kv[0]))]
    return [r for rank in itertools.zip_longest(*queues) for r in rank if r is not None]


def _stratum(cls: str) -> Callable[[Row], Hashable]:
    if cls == "decode":
        return lambda r: (r.m, r.weight_bytes >= BIG_WEIGHTS)
    return lambda r: r.model


def sample(pool: Sequence[Row], total: int = 48, per_class: int = 8, seed: int = 26) -> list[Row]:
    """At least ``per_class`` shapes of every class (where the pool has them) and ``total`` in
    all (more when the classes need more), in pool order."""
    rng = random.Random(seed)
    chosen: list[Row] = []
    taken: set = set()
    counts = {c: sum(c in r.classes for r in pool) for c in CLASSES}
    for cls in sorted(CLASSES, key=lambda c: (counts[c], CLASSES.index(c))):
        have = sum(cls in r.classes for r in chosen)
        for r in _stratified((r for r in pool if cls in r.classes), rng, _stratum(cls)):
            if have >= per_class:
                break
            if r.key not in taken:
                taken.add(r.key)
                chosen.append(r)
                have += 1
    rest = _stratified((r for r in pool if r.key not in taken), rng, lambda r: (r.mclass, r.model))
    chosen += rest[:max(0, total - len(chosen))]
    order = {r.key: i for i, r in enumerate(pool)}
    return sorted(chosen, key=lambda r: order[r.key])


def class_counts(rows: Iterable[Row]) -> dict[str, int]:
    """Shapes per class (a shape counts in each of its classes)."""
    rows = list(rows)
    return {c: sum(c in r.classes for r in rows) for c in CLASSES}


def waves(rows: Sequence[Row], anchors: int, seed: int = 26) -> tuple[list[Row], list[Row]]:
    """(first wave, the rest): ``anchors`` shapes spread over (aligned or not, weights under/over
    8 MB, M class) evolve first, so the rest start from their elites (transfer). The first
    round of the spread takes one shape of every M class (aligned, small weights), the next
    one per M class with large weights, then the misaligned ones."""
    rng = random.Random(seed + 1)
    spread = _stratified(rows, rng, lambda r: ("misaligned" in r.classes, r.weight_bytes >= BIG_WEIGHTS, r.mclass))
    first = {r.key for r in spread[:anchors]}
    return [r for r in rows if r.key in first], [r for r in rows if r.key not in first]


def interleave(rows: Sequence[Row], seed: int = 26) -> list[Row]:
    """Rows in a round-robin over M classes, so a run cut short still spans the sizes."""
    return _stratified(rows, random.Random(seed + 2), lambda r: r.mclass)
