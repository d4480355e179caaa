"""Train/test split of shapes for RL over many shapes (issue 25), by model.

The shapes of ``llm_layers.csv`` (columns M, N, K, model, layer) are split by *model*: a seeded
draw (or an explicit list) names the test models, every shape of a test model is a test shape,
and no test shape is ever a training shape, even where a training model (or the grid) has the
same M, N, K (such shapes are listed as ``withheld``). The grid's shapes, which belong to no
model, go to training unless they are test shapes. So what the adapter is tested on is a model
it never saw, not a neighbour of its training data with another name.

``evo rl split`` writes the split as JSON (``format: evo-rl-split/1``): the ablation benchmark
and the training runs read the same file.
"""
from __future__ import annotations

import csv
import io
import json
import os
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence, Union

from populations import Shape

__all__ = ["LayerRow", "ShapeSplit", "read_layers", "split_by_model", "SPLIT_FORMAT"]

SPLIT_FORMAT = "evo-rl-split/1"


@dataclass(frozen=True)
class LayerRow:
    shape: Shape
    model: str
    layer: str = ""


#: The largest layers CSV read (the real one is a few KB).
LAYERS_LIMIT = 16 << 20


def read_layers(path: Union[str, os.PathLike], layout: str = "TN") -> list[LayerRow]:
    """Rows of an ``M,N,K,model,layer`` CSV (``llm_layers.csv``) as shapes in ``layout``."""
    from populations import read_bounded

    try:
        text = read_bounded(path, LAYERS_LIMIT, "--layers").decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--layers {path}: not UTF-8 text (byte {exc.start}), so not CSV") from None
    out = []
    try:
        for line, r in enumerate(csv.DictReader(io.StringIO(text, newline="")), start=2):
            try:
                out.append(LayerRow(Shape(int(r["M"]), int(r["N"]), int(r["K"]), layout), r["model"].strip(),
                                    (r.get("layer") or "").strip()))
            except (KeyError, TypeError, AttributeError, ValueError) as exc:
                raise ValueError(f"{path}: line {line} is not an M,N,K,model,layer row ({exc})") from None
    except csv.Error as exc:
        raise ValueError(f"{path}: not CSV: {exc}") from None
    return out


@dataclass
class ShapeSplit:
    """Training and test shapes, and the models on each side."""

    train: list[Shape]
    test: list[Shape]
    train_models: list[str]
    test_models: list[str]
    withheld: list[Shape] = field(default_factory=list)  # training-side shapes that are test shapes too
    seed: int = 0

    def check(self, rows: Sequence[LayerRow]) -> None:
        """Raise unless the split is clean: no shared shape, no test model's shape in training."""
        train = set(self.train)
        if train & set(self.test):
            raise ValueError("a shape is on both sides of the split")
        for r in rows:
            if r.model in self.test_models and r.shape in train:
                raise ValueError(f"{r.shape} of test model {r.model} is a training shape")

    def to_dict(self) -> dict[str, Any]:
        return {"format": SPLIT_FORMAT, "seed": self.seed, "train_models": self.train_models,
                "test_models": self.test_models, "train": [str(s) for s in self.train],
                "test": [str(s) for s in self.test], "withheld": [str(s) for s in self.withheld]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ShapeSplit":
        if d.get("format") != SPLIT_FORMAT:
            raise ValueError(f"not an {SPLIT_FORMAT} document")
        return cls([Shape.parse(s) for s in d["train"]], [Shape.parse(s) for s in d["test"]],
                   list(d["train_models"]), list(d["test_models"]), [Shape.parse(s) for s in d.get("withheld", [])],
                   int(d.get("seed", 0)))

    def write(self, path: Union[str, os.PathLike]) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1) + "\n")

    @classmethod
    def read(cls, path: Union[str, os.PathLike]) -> "ShapeSplit":
        return cls.from_dict(json.loads(Path(path).read_text()))


def split_by_model(rows: Sequence[LayerRow], *, test_models: Optional[Iterable[str]] = None,
                   test_share: float = 1 / 3, seed: int = 0, grid: Iterable[Shape] = ()) -> ShapeSplit:
    """Split ``rows`` by model (see the module docstring): ``test_models`` when given, else
    ``round(test_share * models)`` of them (at least one, at most all but one) drawn with ``seed``."""
    models = sorted({r.model for r in rows})
    if len(models) < 2:
        raise ValueError(f"a split by model needs at least two models, got {models}")
    if test_models is None:
        n = min(len(models) - 1, max(1, round(test_share * len(models))))
        chosen = sorted(random.Random(seed).sample(models, n))
    else:
        chosen = sorted(set(test_models))
        unknown = set(chosen) - set(models)
        if unknown or not chosen or len(chosen) == len(models):
            raise ValueError(f"test models must be some, not all, of {models}; got {chosen}")
    test = _unique(r.shape for r in rows if r.model in chosen)
    test_set = set(test)
    candidates = _unique([r.shape for r in rows if r.model not in chosen] + list(grid))
    train = [s for s in candidates if s not in test_set]
    withheld = [s for s in candidates if s in test_set]
    split = ShapeSplit(train, test, [m for m in models if m not in chosen], chosen, withheld, seed)
    split.check(rows)
    return split


def _unique(shapes: Iterable[Shape]) -> list[Shape]:
    return list(dict.fromkeys(shapes))
