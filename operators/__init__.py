"""Proposal operators: knob mutation and crossover, random and Optuna samplers (LLM ones later).

Every operator takes frozen records (:class:`ParentView`, :class:`OperatorContext`) and returns
frozen :class:`Proposal` records; it never evaluates and never writes the archive.
"""
from ._base import OPERATOR_ERROR, Operator, OperatorContext, ParentView, Proposal, score
from ._crossover import KnobCrossover
from ._mutation import KnobMutation
from ._optuna import FLOOR_SPEEDUP, PENALTY, OptunaOperator, objective
from ._random import RandomKnobs
from ._registry import OperatorSpec, available_operators, get_operator, register_operator, registered_operators

__all__ = [
    "OPERATOR_ERROR", "Operator", "OperatorContext", "ParentView", "Proposal", "score",
    "KnobCrossover", "KnobMutation", "OptunaOperator", "RandomKnobs",
    "FLOOR_SPEEDUP", "PENALTY", "objective",
    "OperatorSpec", "available_operators", "get_operator", "register_operator", "registered_operators",
]
