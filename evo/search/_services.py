"""What the engine's collaborators share: one frozen bundle of the run's services.

The proposer (``_engine_propose.py``), the recorder (``_engine_results.py``) and the measure
callbacks (``_callbacks.py``) are handed this instead of sharing the engine's ``self``: each sees
the services by name, and what it may touch is written here once. The bundle is frozen (the
services are never replaced during a run); the objects in it are the engine's own and change
as the run goes (the budget's counters, the archive, each shape's :class:`ShapeState`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Callable, Mapping

from populations import Archive, Calibration, Shape, Template
from operators import Operator

from ._budget import Budget
from ._chooser import OperatorChooser
from ._config import RunConfig
from ._progress import EventLog, Progress
from ._shape_state import ShapeState

__all__ = ["EngineServices"]


@dataclass(frozen=True)
class EngineServices:
    """The run's configuration and services, and every shape's record (see the module docstring)."""

    config: RunConfig
    archive: Archive
    events: EventLog
    progress: Progress
    budget: Budget
    chooser: OperatorChooser
    operators: Mapping[str, Operator]
    templates: Mapping[str, Template]
    #: the loop's random stream (proposals draw parents and operators from it, on the loop's thread)
    rng: random.Random
    arch: str
    clock: Callable[[], float]
    calibration: Calibration
    states: Mapping[Shape, ShapeState]
