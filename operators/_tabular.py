"""A tabular cost model: gradient-boosted trees over knob and shape features.

Features of a (shape, candidate) pair (:func:`features`): log2 of M, N and K, the layout, the
template (one column per template, 1 for the candidate's), each knob's value under its name
(ints as numbers, bools 0/1, strings as their index in the order the model first saw them; a
knob the template lacks is missing, which the trees handle natively), and log2 of the number of
output tiles where the knobs name a tile (``BM``/``BN``, times ``SPLIT_K``), which ties knob
sets to shapes. Knobs of one name share a column across templates (``BM`` is a tile height in
every template that has one), the template columns letting the trees tell them apart.

The regressor is scikit-learn's ``HistGradientBoostingRegressor`` (the ``ranker`` extra) on the
:func:`~._costmodel.target` of every measured record; it is refitted on all records lazily,
when :meth:`TabularCostModel.predict` finds that at least ``refit`` new records, and a tenth of
what the last fit saw, came in (a refit costs tenths of a second on a thousand records).
Before ``min_fit`` records, it predicts 0 for every candidate.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from populations import Candidate, Shape

from ._base import ParentView
from ._costmodel import CostModel, Record, target

__all__ = ["TabularCostModel", "features"]


def features(shape: Shape, candidate: Candidate, strings: Mapping[str, Mapping[str, int]]) -> dict[str, float]:
    """The feature row of ``candidate`` at ``shape`` (see the module docstring); ``strings`` maps
    a knob name to its string values' indices (a string it lacks is left out: missing)."""
    row: dict[str, float] = {"log2_m": math.log2(shape.m), "log2_n": math.log2(shape.n), "log2_k": math.log2(shape.k),
                             "layout_tn": float(shape.layout == "TN")}
    if candidate.template:
        row[f"template={candidate.template}"] = 1.0
    knobs = dict(candidate.knobs or {})
    for name, value in knobs.items():
        if isinstance(value, bool):
            row[f"knob.{name}"] = float(value)
        elif isinstance(value, (int, float)):
            row[f"knob.{name}"] = float(value)
        elif isinstance(value, str) and value in strings.get(name, {}):
            row[f"knob.{name}"] = float(strings[name][value])
    bm, bn = knobs.get("BM"), knobs.get("BN")
    if isinstance(bm, int) and isinstance(bn, int) and bm > 0 and bn > 0:
        split = knobs.get("SPLIT_K", 1)
        split = split if isinstance(split, int) and split > 0 else 1
        row["log2_tiles"] = math.log2(math.ceil(shape.m / bm) * math.ceil(shape.n / bn) * split)
    return row


class TabularCostModel(CostModel):
    """Histogram gradient-boosted trees on :func:`features`, trained on the measured records."""

    name = "tabular"

    def __init__(self, *, min_fit: int = 8, refit: int = 8, max_iter: int = 150, learning_rate: float = 0.1,
                 max_leaf_nodes: int = 15, seed: int = 0, threads: Optional[int] = 1) -> None:
        super().__init__()
        if min_fit < 2 or refit < 1 or max_iter < 1 or not learning_rate > 0:
            raise ValueError("min_fit >= 2, refit >= 1, max_iter >= 1 and learning_rate > 0")
        self.min_fit, self.refit, self.max_iter = min_fit, refit, max_iter
        self.learning_rate, self.max_leaf_nodes, self.seed = learning_rate, max_leaf_nodes, seed
        self.threads = threads  # OpenMP threads of a fit and a prediction (see predict)
        self._strings: dict[str, dict[str, int]] = {}
        self._rows: list[dict[str, float]] = []
        self._targets: list[float] = []
        self._columns: list[str] = []
        self._fitted_on = 0
        self._regressor: Any = None

    def _learn(self, records: list[Record]) -> None:
        for cand, ev in records:
            for name, value in (cand.knobs or {}).items():
                if isinstance(value, str):
                    seen = self._strings.setdefault(name, {})
                    seen.setdefault(value, len(seen))
            self._rows.append(features(ev.shape, cand, self._strings))
            self._targets.append(target(ev))

    def _matrix(self, rows: Sequence[Mapping[str, float]]) -> Any:
        import numpy as np

        return np.array([[row.get(c, math.nan) for c in self._columns] for row in rows], dtype=float)

    def _fit(self) -> None:
        from sklearn.ensemble import HistGradientBoostingRegressor

        n = len(self._rows)
        self._columns = sorted({c for row in self._rows for c in row})
        regressor = HistGradientBoostingRegressor(
            max_iter=self.max_iter, learning_rate=self.learning_rate, max_leaf_nodes=self.max_leaf_nodes,
            min_samples_leaf=max(2, min(20, n // 10)), early_stopping=False, random_state=self.seed)
        regressor.fit(self._matrix(self._rows), self._targets)
        self._regressor, self._fitted_on = regressor, n

    def _stale(self) -> bool:
        n = len(self._rows)
        if n < self.min_fit:
            return False
        return self._regressor is None or n - self._fitted_on >= max(self.refit, self._fitted_on // 10)

    def predict(self, shape: Shape, candidates: Sequence[Candidate],
                parent: Optional[ParentView] = None) -> list[float]:
        """Predicted :func:`~._costmodel.target` per candidate (0.0 before ``min_fit`` records).
        Fits and predictions run on ``threads`` OpenMP threads (1 by default): the engine's
        machine is busy with compile workers, and with scikit-learn's default (a thread per core,
        ``threads=None``) a fit on 1,000 records took 14-43 s instead of 0.15 s on a loaded
        2-core machine (OpenMP threads spinning against other processes)."""
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=self.threads):
            if self._stale():
                self._fit()
            if self._regressor is None or not candidates:
                return [0.0] * len(candidates)
            rows = [features(shape, c, self._strings) for c in candidates]
            return [float(v) for v in self._regressor.predict(self._matrix(rows))]
