"""A tabular cost model: gradient-boosted trees over knob and shape features.

Features of a (shape, candidate) pair (:func:`features`): log2 of M, N and K, the layout, the
template (one column per template, 1 for the candidate's), each knob's value under its name
(ints as numbers, bools 0/1, strings as their index in the order the model first saw them; a
knob the template lacks is missing, which the trees handle natively), and log2 of the number of
output tiles where the knobs name a tile (``BM``/``BN``, times ``SPLIT_K``), which ties knob
sets to shapes, and every integer the candidate's template derives from its knobs and the shape
(``[derived]`` in its ``template.toml``: CTAs, threads, shared memory, registers, tiles, work
units; ``derived.NAME``). Knobs of one name share a column across templates (``BM`` is a tile
height in every template that has one), the template columns letting the trees tell them apart.

The derived values are the template author's own account of what a knob set costs at a shape (how
many CTAs fill the machine, how much shared memory limits residency), which the trees otherwise
have to rebuild from the knobs and log2 of M, N and K. On a real archive (bench/RESULTS.md section
30: 12 shapes, 786 evaluations on an H100, five splits of whole held-out shapes) they raise the
held-out pairwise accuracy from 0.618-0.671 to 0.672-0.740 on every split.

The regressor is scikit-learn's ``HistGradientBoostingRegressor`` (the ``ranker`` extra) on the
:func:`~._costmodel.target` of every measured record; it is refitted on all records lazily,
when :meth:`TabularCostModel.predict` finds that at least ``refit`` new records, and a tenth of
what the last fit saw, came in (a refit costs tenths of a second on a thousand records).
Before ``min_fit`` records, it predicts 0 for every candidate.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional, Sequence

from populations import Candidate, Shape, Template, load_templates

from ._base import ParentView
from ._costmodel import CostModel, Record, target

__all__ = ["TabularCostModel", "derived_values", "features"]


def derived_values(template: Template, shape: Shape, knobs: Mapping[str, Any], arch: int = 90) -> dict[str, float]:
    """The template's derived integers for ``knobs`` at ``shape`` (missing knobs take their
    defaults); a value that cannot be computed (a knob set from another version of the template)
    is left out."""
    try:
        env = template.space.env(template.space.complete(knobs), shape, arch=arch)
    except Exception:  # an unknown knob or value, a derived expression that fails: no derived features
        return {}
    return {name: float(env[name]) for name in template.space.derived
            if isinstance(env.get(name), (int, float)) and not isinstance(env.get(name), bool)}


def features(shape: Shape, candidate: Candidate, strings: Mapping[str, Mapping[str, int]],
             template: Optional[Template] = None, arch: int = 90) -> dict[str, float]:
    """The feature row of ``candidate`` at ``shape`` (see the module docstring); ``strings`` maps
    a knob name to its string values' indices (a string it lacks is left out: missing);
    ``template``: the candidate's template, whose derived values join the row at ``arch``."""
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
    if template is not None:
        row.update({f"derived.{name}": v for name, v in derived_values(template, shape, knobs, arch).items()})
    return row


class TabularCostModel(CostModel):
    """Histogram gradient-boosted trees on :func:`features`, trained on the measured records."""

    name = "tabular"

    def __init__(self, *, min_fit: int = 8, refit: int = 8, max_iter: int = 150, learning_rate: float = 0.1,
                 max_leaf_nodes: int = 15, seed: int = 0, threads: Optional[int] = 1,
                 templates: Optional[Mapping[str, Template]] = None, derived: bool = True, arch: int = 90) -> None:
        """``templates``: where the derived features come from (default: the built-in templates,
        loaded on first use); ``derived`` False leaves them out (the model before they came);
        ``arch``: the compute capability they are computed for."""
        super().__init__()
        if min_fit < 2 or refit < 1 or max_iter < 1 or not learning_rate > 0:
            raise ValueError("min_fit >= 2, refit >= 1, max_iter >= 1 and learning_rate > 0")
        self.derived, self.arch = derived, arch
        self._templates: Optional[Mapping[str, Template]] = dict(templates) if templates is not None else None
        self.min_fit, self.refit, self.max_iter = min_fit, refit, max_iter
        self.learning_rate, self.max_leaf_nodes, self.seed = learning_rate, max_leaf_nodes, seed
        self.threads = threads  # OpenMP threads of a fit and a prediction (see predict)
        self._strings: dict[str, dict[str, int]] = {}
        self._rows: list[dict[str, float]] = []
        self._targets: list[float] = []
        self._columns: list[str] = []
        self._fitted_on = 0
        self._regressor: Any = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_templates"] = None  # a saved model reloads the templates where it is loaded
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("derived", False)  # a model saved before derived features had none
        state.setdefault("arch", 90)
        state.setdefault("_templates", None)
        self.__dict__.update(state)

    def _template(self, name: Optional[str]) -> Optional[Template]:
        if not self.derived or not name:
            return None
        if self._templates is None:
            self._templates = load_templates(errors="warn")
        return self._templates.get(name)

    def _row(self, shape: Shape, cand: Candidate) -> dict[str, float]:
        return features(shape, cand, self._strings, self._template(cand.template), self.arch)

    def _learn(self, records: list[Record]) -> None:
        for cand, ev in records:
            for name, value in (cand.knobs or {}).items():
                if isinstance(value, str):
                    seen = self._strings.setdefault(name, {})
                    seen.setdefault(value, len(seen))
            self._rows.append(self._row(ev.shape, cand))
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
            rows = [self._row(shape, c) for c in candidates]
            return [float(v) for v in self._regressor.predict(self._matrix(rows))]
