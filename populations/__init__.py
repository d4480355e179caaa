"""Records, archives and seed templates: the part of evo every other package builds on.

This package imports nothing else of ours (see DESIGN.md's import rule).
"""
from ._codec import SCHEMA_VERSION, CodecError, decode, encode, from_plain, to_plain
from ._expr import ExprError, evaluate
from ._plan import Launch, LaunchPlan, PlanError, ResolvedLaunch, TensorMapSpec
from ._records import Candidate, Evaluation, KernelStats, Status, TimerResult, candidate_id
from ._shape import Shape, ShapeError
from ._knobs import Constraint, Knob, KnobSpace, TemplateError
from ._template import Template, load_template, load_templates
from ._archive import Archive, ArchiveError, ArchiveLockedError, Elite, LineageNode
from ._roofline import (CALIBRATION_FILE, H200_DEFAULTS, Calibration, attainable_frac, attainable_time,
                        read_calibration, roofline_frac, roofline_time, write_calibration)

__all__ = [
    "SCHEMA_VERSION", "CodecError", "decode", "encode", "from_plain", "to_plain",
    "ExprError", "evaluate",
    "Launch", "LaunchPlan", "PlanError", "ResolvedLaunch", "TensorMapSpec",
    "Candidate", "Evaluation", "KernelStats", "Status", "TimerResult", "candidate_id",
    "Shape", "ShapeError",
    "Constraint", "Knob", "KnobSpace", "TemplateError", "Template", "load_template", "load_templates",
    "Archive", "ArchiveError", "ArchiveLockedError", "Elite", "LineageNode",
    "CALIBRATION_FILE", "H200_DEFAULTS", "Calibration", "attainable_frac", "attainable_time",
    "read_calibration", "roofline_frac", "roofline_time", "write_calibration",
]
