"""evo's search wing: the engine that evolves a population per shape.

The engine (``_engine.py``: one ``ShapeState`` per shape, its proposer and recorder
collaborators, the operator chooser, the shape allocator and its measure callbacks), the run configuration
(``_config.py``), the time and GPU budget (``_budget.py``), parent selection, seeding and
transfer between shapes, the operator bandit, the roofline calibration, progress events and the
LLM's GPU placement. It imports ``populations``, ``operators`` and ``evaluators``; of evo, nothing
(the CLI and the RL wing sit above it).
"""
from ._calibration import ensure_calibration, evaluation_roofline, load_calibration
from ._callbacks import MeasureCallback, Measured
from ._config import ConfigError, PoolConfig, RunConfig, load_config, merge
from ._engine import Engine, RunResult, pool_gpus
from ._llm_placement import device_index, llm_placement, place_llm
from ._progress import EVENTS_FILE, EventLog, Progress
from ._seeding import seed_population
from ._services import EngineServices

__all__ = ["ensure_calibration", "evaluation_roofline", "load_calibration", "ConfigError", "PoolConfig", "RunConfig",
           "load_config", "merge", "Engine", "RunResult", "pool_gpus", "device_index", "llm_placement", "place_llm",
           "EVENTS_FILE", "EventLog", "Progress", "seed_population", "MeasureCallback", "Measured", "EngineServices"]
