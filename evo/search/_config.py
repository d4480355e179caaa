"""Run configuration: an optional TOML file, overridden by command-line flags.

``RunConfig`` is the one place every knob of ``evo run`` lives, with its default and its check.
:func:`load_config` reads a TOML file (docs/run.md is the reference), :func:`merge` lays flags
over it, and every problem raises :class:`ConfigError` with a sentence naming the key; the
command turns that into exit status 2.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from populations import Shape, ShapeError

from ._budget import AllocationConfig
from ._opbandit import BanditConfig

__all__ = ["ConfigError", "RunConfig", "SelectionConfig", "PoolConfig", "TransferConfig",
           "parse_duration", "parse_operators", "load_config", "merge"]

_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
#: The largest count (evaluations, tokens, a window) a run accepts: far beyond any real run, small
#: enough that arithmetic on it stays cheap (a 30-digit count would never be reached, only waited for).
COUNT_LIMIT = 10 ** 9
#: The largest run configuration file read (a real one is a few KB).
CONFIG_LIMIT = 1 << 20


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key and says why."""


def parse_duration(text: Union[str, int, float], key: str = "budget") -> float:
    """``"20m"``, ``"1h30m"``, ``"90s"``, ``"1.5h"``, ``"250ms"`` or a bare number of seconds -> seconds."""
    if isinstance(text, bool):
        raise ConfigError(f"{key}: expected a duration such as 20m, 1h30m or 90s, got {text!r}")
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        raw = str(text).strip().lower().replace(" ", "")
        if re.fullmatch(r"\d+(?:\.\d+)?", raw):
            seconds = float(raw)
        else:
            pos, seconds = 0, 0.0
            for match in _DURATION.finditer(raw):
                if match.start() != pos:
                    break
                seconds += float(match.group(1)) * _UNITS[match.group(2)]
                pos = match.end()
            if pos != len(raw) or not raw:
                raise ConfigError(f"{key}: cannot read duration {text!r}; use e.g. 20m, 1h30m, 90s or 2h")
    if not seconds > 0 or seconds != seconds or seconds == float("inf"):
        raise ConfigError(f"{key}: duration must be positive, got {text!r}")
    return seconds


def parse_operators(value: Union[str, list, Mapping[str, Any]], key: str = "operators") -> dict[str, float]:
    """``"knob,optuna"``, ``"knob:3,optuna:1"``, a list of names or a ``{name: weight}`` table -> weights."""
    items: list[tuple[str, Any]]
    if isinstance(value, str):
        items = []
        for part in filter(None, (p.strip() for p in value.split(","))):
            name, _, weight = part.partition(":")
            items.append((name.strip(), weight.strip() or 1.0))
    elif isinstance(value, (list, tuple)):
        items = [(str(v), 1.0) for v in value]
    elif isinstance(value, Mapping):
        items = list(value.items())
    else:
        raise ConfigError(f"{key}: expected 'knob,optuna', a list or a table of weights, got {value!r}")
    out: dict[str, float] = {}
    for name, weight in items:
        if not name or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_.-]*", name):
            raise ConfigError(f"{key}: bad operator name {name!r}")
        try:
            w = float(weight)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: weight of {name!r} must be a number, got {weight!r}") from None
        if not w > 0 or w == float("inf"):
            raise ConfigError(f"{key}: weight of {name!r} must be positive, got {weight!r}")
        out[name] = w
    if not out:
        raise ConfigError(f"{key}: name at least one operator (e.g. knob)")
    return out


@dataclass
class SelectionConfig:
    """How parents are drawn from a shape's population (see evo/search/_selection.py)."""

    method: str = "tournament"        # tournament | power
    tournament_size: int = 3
    power_alpha: float = 1.5          # P(rank r) ~ r**-alpha over fitness ranks
    elites: int = 8                   # best candidates always kept and selectable
    cells: bool = True                # keep the best of each feature cell (diversity)
    population: int = 64              # selectable members when cells are off (top by fitness)
    parents: int = 2                  # parents handed to an operator per proposal
    register_bucket: int = 32         # registers are binned by this width in the feature cell


@dataclass
class PoolConfig:
    """The evaluator pool (evaluators.LocalPool, or RayPool with ``ray``) and how much work is kept in flight."""

    gpus: list[int] = field(default_factory=list)  # empty: every visible GPU
    compile_workers: int = 4
    max_inflight: int = 0             # 0: 2 x GPUs + compile workers
    arch: str = "auto"                # auto: what the pool reports for its GPU (sm_90a on an H200)
    drain_s: float = 60.0             # first Ctrl-C: how long in-flight work may still finish
    max_consecutive_errors: int = 16  # stop when this many results in a row are runtime errors (0: never)
    ray: str = ""                     # "": the local pool; "auto" or a cluster address: evaluators.RayPool
    loader: str = "driver"            # how workers load and launch kernels: driver (cuda.bindings) or pycuda

    def inflight(self, gpus: int) -> int:
        """The in-flight bound for a pool with ``gpus`` GPUs."""
        return self.max_inflight or 2 * max(1, gpus) + self.compile_workers


@dataclass
class TransferConfig:
    """Seeding a new shape from its nearest archived shapes."""

    enabled: bool = True
    neighbors: int = 3                # nearest archived shapes used
    per_neighbor: int = 4             # elites re-rendered from each
    near: float = 1.0                 # log2 distance within which transfers lead the seed queue


@dataclass
class RLConfig:
    """Periodic RL updates of the LLM operators' model during a run (evo.rl, ``--rl-every N``)."""

    every: int = 0                    # evaluations between updates (0: off)
    mode: str = "grpo"                # grpo: the generator from LLM-made rows; rank: the ranker from every pair
    steps: int = 4                    # GRPO (or ranking) steps per update
    group_size: int = 8               # completions sampled per prompt
    window: int = 256                 # the newest LLM-made rows (rank: pairs) of the archive trained on
    lr: float = 2e-3
    wait_s: float = 0.0               # at the end of the run, wait this long for an update in progress


@dataclass
class RunConfig:
    """Everything ``evo run`` needs; defaults are the documented ones (docs/run.md)."""

    shapes: list[Shape] = field(default_factory=list)
    archive: Optional[Path] = None
    budget_s: Optional[float] = None          # wall time
    gpu_seconds: Optional[float] = None       # sum of correctness_s + timing_s
    max_evals: Optional[int] = None           # evaluations in this run
    max_tokens: Optional[int] = None          # LLM tokens reported by operators
    operators: dict[str, float] = field(default_factory=lambda: {"knob": 1.0})
    seed: int = 0
    converge_window: Optional[int] = None     # None: never stop for convergence
    converge_threshold: float = 0.005         # relative improvement that counts (0.5 %)
    batch: int = 1                            # proposals asked of an operator per step
    seeds_per_template: int = 4               # cold start: heuristic picks + spread samples per template
    specialize: bool = False                  # render seeds/transfers specialised to the shape
    progress: str = "auto"                    # auto | rich | plain | none
    progress_interval_s: float = 5.0          # plain progress line period
    selection: SelectionConfig = field(default_factory=SelectionConfig)
    pool: PoolConfig = field(default_factory=PoolConfig)
    transfer: TransferConfig = field(default_factory=TransferConfig)
    rl: RLConfig = field(default_factory=RLConfig)
    allocation: AllocationConfig = field(default_factory=AllocationConfig)
    bandit: BanditConfig = field(default_factory=BanditConfig)

    def validate(self) -> "RunConfig":
        """Check cross-field rules; returns self so calls chain."""
        if not self.shapes:
            raise ConfigError("shapes: give at least one --shape MxNxK (or shapes = [...] in the config file)")
        if len(set(self.shapes)) != len(self.shapes):
            raise ConfigError("shapes: a shape is listed twice")
        if self.archive is None:
            raise ConfigError("archive: give --archive DIR (or archive = \"DIR\" in the config file)")
        for name in ("max_evals", "max_tokens", "converge_window"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ConfigError(f"{name}: must be a positive integer, got {v!r}")
            if v is not None and v > COUNT_LIMIT:
                raise ConfigError(f"{name}: {v} is more than this evo will count to ({COUNT_LIMIT:,}); "
                                  "leave it out for no limit")
        if self.gpu_seconds is not None and not self.gpu_seconds > 0:
            raise ConfigError(f"gpu_seconds: must be positive, got {self.gpu_seconds!r}")
        if not 0 <= self.converge_threshold < 10:
            raise ConfigError(f"converge_threshold: a fraction such as 0.005, got {self.converge_threshold!r}")
        if self.batch < 1 or self.seeds_per_template < 1:
            raise ConfigError("batch and seeds_per_template: must be >= 1")
        if self.progress not in ("auto", "rich", "plain", "none"):
            raise ConfigError(f"progress: one of auto, rich, plain, none; got {self.progress!r}")
        s = self.selection
        if s.method not in ("tournament", "power"):
            raise ConfigError(f"selection.method: 'tournament' or 'power', got {s.method!r}")
        for name in ("tournament_size", "elites", "parents", "register_bucket", "population"):
            if getattr(s, name) < 1:
                raise ConfigError(f"selection.{name}: must be >= 1")
        if not s.power_alpha > 0:
            raise ConfigError("selection.power_alpha: must be positive")
        p = self.pool
        if any(isinstance(g, bool) or not isinstance(g, int) or g < 0 for g in p.gpus) or len(set(p.gpus)) != len(p.gpus):
            raise ConfigError(f"pool.gpus: a list of distinct GPU indices (empty: all visible), got {p.gpus!r}")
        if p.compile_workers < 1 or p.max_inflight < 0 or not p.drain_s >= 0 or p.max_consecutive_errors < 0:
            raise ConfigError("pool: compile_workers >= 1; max_inflight, drain_s and max_consecutive_errors >= 0")
        from evaluators import LOADERS  # the kernel loaders' registry (imported here: 0.15 s commands without a run skip)

        if p.loader not in LOADERS:
            raise ConfigError(f"pool.loader: one of {', '.join(LOADERS.names())}, got {p.loader!r}")
        r = self.rl
        if r.every < 0 or r.steps < 1 or r.group_size < 2 or r.window < 1 or not r.lr > 0 or not r.wait_s >= 0:
            raise ConfigError("rl: every >= 0, steps >= 1, group_size >= 2, window >= 1, lr > 0, wait_s >= 0")
        if r.mode not in ("grpo", "rank"):
            raise ConfigError(f"rl.mode: grpo or rank, got {r.mode!r}")
        a = self.allocation
        if not 0 < a.saturated <= 10 or a.stall_window < 0 or not 0 <= a.stall_threshold < 10 or a.min_evals < 0:
            raise ConfigError("allocation: saturated in (0, 10], stall_window >= 0, stall_threshold in [0, 10), "
                              "min_evals >= 0")
        if self.transfer.neighbors < 0 or self.transfer.per_neighbor < 0 or self.transfer.near < 0:
            raise ConfigError("transfer: neighbors, per_neighbor and near must be >= 0")
        return self


# -- the TOML file --------------------------------------------------------------------------
_SECTIONS = {"selection": SelectionConfig, "pool": PoolConfig, "transfer": TransferConfig, "rl": RLConfig,
             "allocation": AllocationConfig, "bandit": BanditConfig}
_TOP = {"shapes", "archive", "budget", "gpu_seconds", "max_evals", "max_tokens", "operators", "seed",
        "converge_window", "converge_threshold", "batch", "seeds_per_template", "specialize", "progress",
        "progress_interval", *_SECTIONS}


def load_config(path: Union[str, Path]) -> dict[str, Any]:
    """Read a TOML file into the plain overrides :func:`merge` takes; unknown keys are errors."""
    from populations import InputFileError, load_toml

    path = Path(path)
    try:
        data = load_toml(path, CONFIG_LIMIT, "config:")
    except InputFileError as exc:
        raise ConfigError(str(exc)) from None
    extra = set(data) - _TOP
    if extra:
        raise ConfigError(f"config {path}: unknown key(s) {sorted(extra)}; known: {sorted(_TOP)}")
    for name, cls in _SECTIONS.items():
        if name in data:
            if not isinstance(data[name], dict):
                raise ConfigError(f"config {path}: [{name}] must be a table")
            known = {f.name for f in dataclasses.fields(cls)}
            bad = set(data[name]) - known
            if bad:
                raise ConfigError(f"config {path}: unknown key(s) {sorted(bad)} in [{name}]; known: {sorted(known)}")
    if isinstance(data.get("archive"), str) and data["archive"].strip() and not Path(data["archive"]).is_absolute():
        data["archive"] = str(path.parent / str(data["archive"]))  # relative to the file, not the cwd
    return data


def merge(file_values: Mapping[str, Any], flags: Mapping[str, Any]) -> RunConfig:
    """A validated :class:`RunConfig` from file values with flags (non-None ones) laid over them."""
    values: dict[str, Any] = {k: v for k, v in file_values.items()}
    for k, v in flags.items():
        if v is None:
            continue
        if k in _SECTIONS:
            values[k] = {**values.get(k, {}), **v}
        else:
            values[k] = v
    cfg = RunConfig()
    try:
        if "shapes" in values:
            raw = values["shapes"]
            if isinstance(raw, str) or not isinstance(raw, (list, tuple)):
                raise ConfigError(f"shapes: a list of strings like '4096x4096x4096', got {raw!r}")
            cfg.shapes = [s if isinstance(s, Shape) else Shape.parse(s) for s in raw]
        if "archive" in values:
            if not isinstance(values["archive"], (str, Path)) or not str(values["archive"]).strip():
                raise ConfigError(f"archive: name a directory, e.g. runs/a (got {values['archive']!r}; "
                                  "an empty path is not the current directory)")
            cfg.archive = Path(str(values["archive"]))
        if "budget" in values:
            cfg.budget_s = parse_duration(values["budget"], "budget")
        if "gpu_seconds" in values:
            cfg.gpu_seconds = parse_duration(values["gpu_seconds"], "gpu_seconds")
        if "operators" in values:
            cfg.operators = parse_operators(values["operators"])
        if "progress_interval" in values:
            cfg.progress_interval_s = parse_duration(values["progress_interval"], "progress_interval")
        for name, typ in (("max_evals", int), ("max_tokens", int), ("converge_window", int), ("seed", int),
                          ("batch", int), ("seeds_per_template", int), ("converge_threshold", float),
                          ("specialize", bool), ("progress", str)):
            if name in values:
                setattr(cfg, name, _typed(values[name], typ, name))
        for name, cls in _SECTIONS.items():
            section = getattr(cfg, name)
            for key, v in (values.get(name) or {}).items():
                default = getattr(section, key)
                typ = type(default) if not isinstance(default, list) else list
                setattr(section, key, _typed(v, typ, f"{name}.{key}"))
    except ShapeError as exc:
        raise ConfigError(f"shape: {exc}") from None
    return cfg.validate()


def _typed(value: Any, typ: type, key: str) -> Any:
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if typ is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if typ is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if typ is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return value
    if not isinstance(value, typ):
        raise ConfigError(f"{key}: expected {typ.__name__}, got {value!r}")
    return value
