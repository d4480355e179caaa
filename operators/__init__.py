"""Proposal operators: knob mutation and crossover, random and Optuna samplers, the ranking step
and its cost models (LLM operators in ``operators.llm``).

Operators that call a model derive from :class:`ModelOperator`; callers read its members through
:func:`model_face` and :func:`model_usage`. Operators are named in one :class:`populations.Registry`
(:data:`OPERATORS`, fed by ``settings.toml``).

Every operator takes frozen records (:class:`ParentView`, :class:`OperatorContext`) and returns
frozen :class:`Proposal` records; it never evaluates and never writes the archive.
"""
from ._base import OPERATOR_ERROR, Operator, OperatorContext, ParentView, Proposal, score
from ._costmodel import (COST_MODEL_FORMAT, CostModel, Record, archive_records, cost_models, get_cost_model,
                         load_cost_model, register_cost_model)
from ._crossover import KnobCrossover
from ._model import ModelFace, ModelOperator, ModelUsage, model_face, model_usage
from ._mutation import KnobMutation
from ._optuna import FLOOR_SPEEDUP, PENALTY, OptunaOperator, objective
from ._random import RandomKnobs
from ._ranked import RankedOperator
from ._tabular import TabularCostModel, derived_values, features
from ._thompson import ThompsonRates
from ._registry import (OPERATORS, OperatorSpec, available_operators, get_operator, register_operator,
                        registered_operators)

__all__ = [
    "OPERATOR_ERROR", "Operator", "OperatorContext", "ParentView", "Proposal", "score",
    "ModelFace", "ModelOperator", "ModelUsage", "model_face", "model_usage",
    "KnobCrossover", "KnobMutation", "OptunaOperator", "RandomKnobs", "RankedOperator",
    "COST_MODEL_FORMAT", "CostModel", "Record", "TabularCostModel", "archive_records", "cost_models", "derived_values", "features",
    "get_cost_model", "load_cost_model", "register_cost_model",
    "FLOOR_SPEEDUP", "PENALTY", "objective",
    "OPERATORS", "OperatorSpec", "available_operators", "get_operator", "register_operator", "registered_operators",
    "ThompsonRates",
]
