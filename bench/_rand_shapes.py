"""The random-shape benchmark's shapes (issue 34): drawn from a seed, never from a table.

Distributions (every row TN, as ``nn.Linear``: A is M x K, the weights N x K):

- M: log-uniform integer in [1, 16384] (``floor(exp(U(ln 1, ln 16385)))``);
- N, K: log-uniform integers in [64, 32768] the same way. A row is **ragged** with probability
  :data:`RAGGED_SHARE` (0.4): N and K stay the integers drawn, so N or K is almost always not a
  multiple of 8. Otherwise it is **aligned**: N and K are rounded to the nearest multiple of a
  granule drawn from :data:`GRANULES` (8, 16, 64, 128, as real layer widths are; within range).
  Without this split nearly every integer pair would be misaligned (63 in 64), and the set
  would say little about the aligned shapes users mostly bring.
- Caps, so that one benchmark fits its time budget: a draw over :data:`MAX_FLOP` (4e12 FLOP,
  about 5.5 ms of cuBLAS on an H200) or whose operands A + W + C in fp16 exceed
  :data:`MAX_OPERAND_BYTES` (1 GiB) is redrawn whole, as is a shape drawn already. This trims the
  distributions' far tail (about 1-2% of draws).

Quotas (issue 34), met by stratified drawing: ``count`` (100) rows from the distributions above;
then, class by class, further rows drawn from the same distributions *conditioned on the class*
(rejection: draws outside the class are thrown away) until the quota holds: at least
:data:`QUOTAS` rows with M <= 16 (15), with M 64-2047 (25), of >= 1e11 FLOP (10), and at least
:data:`MISALIGNED_SHARE` (30%) of all rows with N or K % 8 != 0 (filled last, as the total grows).
So the set has ``count`` rows or more, and is the same list for the same seed and count.

Classes of the report (a row is in every class whose rule it meets): ``decode`` M <= 16, ``mid``
M 17-2047, ``m2048`` M >= 2048, ``misaligned`` N or K % 8 != 0, ``big`` >= 1e11 FLOP, ``small``
under 1e8 FLOP.

Seeds: each new measurement takes a seed not used before; :func:`used_seeds` reads the ones
``bench/RESULTS.md`` records (its commands), so the script can say when a seed is reused.
"""
from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from _llm_sample import GemmRow

__all__ = ["RandRow", "CLASSES", "LABELS", "QUOTAS", "QUOTA_LABELS", "MISALIGNED_SHARE", "RAGGED_SHARE", "GRANULES",
           "M_RANGE", "NK_RANGE", "MAX_FLOP", "MAX_OPERAND_BYTES", "classes_of", "generate", "quota_counts",
           "used_seeds", "RESULTS_MD"]

M_RANGE = (1, 16384)
NK_RANGE = (64, 32768)
RAGGED_SHARE = 0.4
GRANULES = (8, 16, 64, 128)
MAX_FLOP = 4e12
MAX_OPERAND_BYTES = 1 << 30
BIG_FLOP = 1e11
SMALL_FLOP = 1e8
MISALIGNED_SHARE = 0.30
#: quota name -> (rows at least, rule on (m, n, k))
QUOTAS: dict[str, tuple[int, Callable[[int, int, int], bool]]] = {
    "decode": (15, lambda m, n, k: m <= 16),
    "m64_2047": (25, lambda m, n, k: 64 <= m <= 2047),
    "big": (10, lambda m, n, k: 2 * m * n * k >= BIG_FLOP),
}
QUOTA_LABELS = {"decode": "M <= 16", "m64_2047": "M 64-2047", "big": ">= 1e11 FLOP", "misaligned": "N or K % 8 != 0"}
CLASSES = ("decode", "mid", "m2048", "misaligned", "big", "small")
LABELS = {"decode": "decode (M <= 16)", "mid": "mid (M 17-2047)", "m2048": "M >= 2048",
          "misaligned": "misaligned (N or K % 8 != 0)", "big": ">= 1e11 FLOP", "small": "under 1e8 FLOP"}
RESULTS_MD = Path(__file__).resolve().parent / "RESULTS.md"
MAX_TRIES = 100_000  # rejection draws per row before giving up (a quota no draw can meet)


def misaligned(n: int, k: int) -> bool:
    return bool(n % 8 or k % 8)


def classes_of(m: int, n: int, k: int) -> tuple[str, ...]:
    """Every class (of :data:`CLASSES`, in that order: the M class first) the row is in."""
    out = ["decode" if m <= 16 else "mid" if m <= 2047 else "m2048"]
    flops = 2 * m * n * k
    out += [c for c, yes in (("misaligned", misaligned(n, k)), ("big", flops >= BIG_FLOP), ("small", flops < SMALL_FLOP))
            if yes]
    return tuple(out)


@dataclass(frozen=True)
class RandRow(GemmRow):
    """One drawn shape; ``origin`` says how (``draw i`` or ``quota Q, draw i``)."""

    m: int
    n: int
    k: int
    origin: str = ""
    classes: tuple[str, ...] = field(default=(), compare=False)
    classes_of = staticmethod(classes_of)

    @property
    def mclass(self) -> str:
        return self.classes[0]

    def to_dict(self) -> dict:
        return {**self.base_dict(), "origin": self.origin}

    @classmethod
    def from_dict(cls, d: dict) -> "RandRow":
        """The row :meth:`to_dict` wrote."""
        return cls(int(d["M"]), int(d["N"]), int(d["K"]), d.get("origin", ""))


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    """An integer in [lo, hi], each with mass ln((i + 1) / i) / ln((hi + 1) / lo)."""
    return min(hi, int(math.exp(rng.uniform(math.log(lo), math.log(hi + 1)))))


def _aligned(x: int, granule: int) -> int:
    lo, hi = NK_RANGE
    return min(hi // granule * granule, max(-(-lo // granule) * granule, round(x / granule) * granule))


def _draw(rng: random.Random) -> tuple[int, int, int]:
    """One (M, N, K) from the distributions, before the caps."""
    m = _log_uniform(rng, *M_RANGE)
    n, k = _log_uniform(rng, *NK_RANGE), _log_uniform(rng, *NK_RANGE)
    if rng.random() >= RAGGED_SHARE:
        g = GRANULES[rng.randrange(len(GRANULES))]
        n, k = _aligned(n, g), _aligned(k, g)
    return m, n, k


def _fits(m: int, n: int, k: int) -> bool:
    return 2 * m * n * k <= MAX_FLOP and 2 * (m * k + n * k + m * n) <= MAX_OPERAND_BYTES


def _draw_row(rng: random.Random, taken: set, rule: Optional[Callable[[int, int, int], bool]] = None) -> tuple[int, int, int]:
    """A draw within the caps, not taken yet, and (conditioning by rejection) meeting ``rule``."""
    for _ in range(MAX_TRIES):
        m, n, k = _draw(rng)
        if _fits(m, n, k) and (m, n, k) not in taken and (rule is None or rule(m, n, k)):
            taken.add((m, n, k))
            return m, n, k
    raise ValueError("no draw meets the quota's rule within the caps")


def generate(seed: int, count: int = 100) -> list[RandRow]:
    """The rows for ``seed``: ``count`` draws, then conditional draws until every quota holds."""
    if count < 1:
        raise ValueError("count >= 1")
    rng = random.Random(seed)
    taken: set = set()
    rows = [RandRow(*_draw_row(rng, taken), origin=f"draw {i}") for i in range(count)]
    for name, (least, rule) in QUOTAS.items():
        while sum(rule(r.m, r.n, r.k) for r in rows) < least:
            rows.append(RandRow(*_draw_row(rng, taken, rule), origin=f"quota {name}, draw {len(rows)}"))
    while sum("misaligned" in r.classes for r in rows) < math.ceil(MISALIGNED_SHARE * len(rows) - 1e-9):
        rows.append(RandRow(*_draw_row(rng, taken, lambda m, n, k: misaligned(n, k)),
                            origin=f"quota misaligned, draw {len(rows)}"))
    return rows


def quota_counts(rows: Iterable[RandRow]) -> dict[str, tuple[int, int]]:
    """{quota: (rows meeting it, rows it asks for)}; misaligned's ask is its share of the total."""
    rows = list(rows)
    out = {name: (sum(rule(r.m, r.n, r.k) for r in rows), least) for name, (least, rule) in QUOTAS.items()}
    out["misaligned"] = (sum("misaligned" in r.classes for r in rows), math.ceil(MISALIGNED_SHARE * len(rows) - 1e-9))
    return out


_SEED_RE = (re.compile(r"random_shapes_bench\.py\b[^\n]*?--seed[ =](\d+)"), re.compile(r"\bSEED=(\d+)[^\n]*random-shapes"))


def used_seeds(path: Optional[Path] = None) -> list[int]:
    """The seeds that ``path``'s (default :data:`RESULTS_MD`) recorded commands used
    (``random_shapes_bench.py ... --seed N``, ``SEED=N ... random-shapes``), sorted; none when
    the file is missing."""
    try:
        text = (path or RESULTS_MD).read_text()
    except OSError:
        return []
    return sorted({int(x) for rx in _SEED_RE for x in rx.findall(text)})
