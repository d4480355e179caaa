"""Records, archives and seed templates: the part of evo every other package builds on.

This package imports nothing else of ours (the import rule: docs/design.md, section 2).
"""
import logging as _logging

from ._codec import SCHEMA_VERSION, CodecError, decode, encode, from_plain, to_plain
from ._expr import ExprError, evaluate
from ._plan import (POINTER_ARGS, Launch, LaunchPlan, PlanError, ResolvedLaunch, StagedCopy, TensorMapSpec,
                    staged_pitch, stored_dims)
from ._records import MEASUREMENT_KEYS, Candidate, Evaluation, KernelStats, Measurement, Status, TimerResult, candidate_id
from ._shape import Shape, ShapeError
from ._knobs import Constraint, Knob, KnobSpace, TemplateError, knob_key
from ._staging import stage_grid
from ._template import Template
from ._template_load import load_template, load_templates
from ._archive import LOCK, MANIFEST, Archive, ArchiveDamagedError, ArchiveError, ArchiveLockedError, CandidateInfo, LineageNode
from ._bounded import InputFileError, load_toml, read_bounded
from ._check import CheckResult, RepairResult, check_archive, repair_archive
from ._registry import Registry, UnknownName
from ._ranking import DISQUALIFYING, Elite, disqualifies, elite_fitness, elite_order, rank
from ._log import atomic_write
from ._roofline import (CALIBRATION_FILE, H200_DEFAULTS, Calibration, attainable_frac, attainable_time,
                        read_calibration, roofline_frac, roofline_time, write_calibration)

__all__ = [
    "SCHEMA_VERSION", "CodecError", "decode", "encode", "from_plain", "to_plain",
    "ExprError", "evaluate",
    "POINTER_ARGS", "Launch", "LaunchPlan", "PlanError", "ResolvedLaunch", "StagedCopy", "TensorMapSpec",
    "staged_pitch", "stage_grid", "stored_dims",
    "Candidate", "Evaluation", "KernelStats", "MEASUREMENT_KEYS", "Measurement", "Status", "TimerResult", "candidate_id",
    "Shape", "ShapeError",
    "Constraint", "Knob", "KnobSpace", "TemplateError", "knob_key", "Template", "load_template", "load_templates",
    "DISQUALIFYING", "LOCK", "MANIFEST", "Archive", "ArchiveDamagedError", "ArchiveError", "ArchiveLockedError", "CandidateInfo", "Elite",
    "LineageNode", "InputFileError", "load_toml", "read_bounded", "CheckResult", "RepairResult", "check_archive", "repair_archive", "atomic_write", "disqualifies", "elite_fitness", "elite_order", "rank",
    "Registry", "UnknownName",
    "CALIBRATION_FILE", "H200_DEFAULTS", "Calibration", "attainable_frac", "attainable_time",
    "read_calibration", "roofline_frac", "roofline_time", "write_calibration",
]

# A library logs, it does not print: without this, Python's last-resort handler writes each damage
# warning to stderr a second time beside the command line's own one-line report.
_logging.getLogger(__name__).addHandler(_logging.NullHandler())
