"""The library's front door: seed archives, build pools and operators, run a search.

``evo seed`` and ``evo run`` are thin shells over this module (they parse flags and print), and
tests, benchmarks and other programs call it directly, with their own evaluator pool where they
need one (:func:`run_search`'s ``pool_factory``), so no command-line flag exists for tests alone.

- :func:`seed_shapes` / :func:`write_seeds`: first populations from the templates.
- :func:`make_pool`: ``evaluators.LocalPool``, or ``evaluators.RayPool`` when ``pool.ray`` is set.
- :func:`make_operators` (with :data:`ALIASES` and :func:`expand_operators`): the operators a
  run's weights name.
- :func:`run_search`: one run over an archive, from an open writer to a committed, closed one.
"""
from __future__ import annotations

import os
import random
import signal
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence, TextIO

from populations import Archive, Candidate, Shape, Template, load_templates

from ..search import ConfigError, EngineServices, MeasureCallback, Measured, PoolConfig, RunConfig
from ..search import seed_population

if TYPE_CHECKING:
    from evaluators import EvaluatorPool

    from ..rl import RLUpdater
    from ..search import RunResult

__all__ = ["seed_shapes", "write_seeds", "make_pool", "make_operators", "expand_operators", "known_model",
           "run_search", "ALIASES", "PoolFactory"]

#: Builds the evaluator pool a run uses from its ``[pool]`` settings.
PoolFactory = Callable[[PoolConfig], "EvaluatorPool"]


# -- seeding ------------------------------------------------------------------------------------
def seed_shapes(shapes: Sequence[Shape], templates: Mapping[str, Template], per_template: int, *, seed: int = 0,
                arch: str = "sm_90a", specialize: bool = False) -> dict[Shape, list[Candidate]]:
    """Heuristic picks and spread-out samples per shape (one random stream over all shapes, in
    order). ValueError when a shape gets no candidate (no template covers it on ``arch``)."""
    rng = random.Random(seed)
    per_shape = {s: seed_population(s, list(templates.values()), per_template, rng, arch=arch, specialize=specialize)
                 for s in shapes}
    empty = [s for s, cands in per_shape.items() if not cands]
    if empty:
        whys = "; ".join(f"{t.name}: {t.why_not(empty[0], arch) or 'no valid knob set at this shape'}"
                         for t in sorted(templates.values(), key=lambda t: t.name))
        raise ValueError(f"no template covers {', '.join(map(str, empty))} on {arch}, so nothing was written; "
                         f"at {empty[0]}: {whys}")
    return per_shape


def write_seeds(archive: Archive, per_shape: Mapping[Shape, Sequence[Candidate]]) -> int:
    """Add the seeds to an archive open for writing and commit; returns how many were new (a seed
    already in the archive, from an earlier evo seed, is not written again)."""
    new = 0
    for shape, cands in per_shape.items():
        present = set(archive.candidate_ids(shape))
        for c in cands:
            new += c.id not in present
            present.add(c.id)
            archive.add(c)
    archive.commit()
    return new


# -- pools --------------------------------------------------------------------------------------
def make_pool(pool: PoolConfig) -> "EvaluatorPool":
    """The pool registered as ``local`` (evaluators.LocalPool), or as ``ray`` (evaluators.RayPool)
    when ``pool.ray`` names a cluster (evaluators.POOLS)."""
    from evaluators import POOLS, RayUnavailable  # imported here, not at start-up: it may pull in CUDA bindings

    common = {"gpus": pool.gpus or None, "compile_workers": pool.compile_workers,
              "max_in_flight": pool.max_inflight or None, "arch": None if pool.arch == "auto" else pool.arch,
              "worker_options": {"loader": pool.loader}}
    try:
        return POOLS.create("ray", address=pool.ray, **common) if pool.ray else POOLS.create("local", **common)
    except RayUnavailable as exc:
        raise ConfigError(f"--ray {pool.ray}: {exc}") from None


def need_gpus(pool: PoolConfig) -> None:
    """ConfigError, before anything is created, when the local pool would have no GPU to use."""
    if pool.ray:
        return  # a Ray cluster's GPUs may be on other nodes
    from evaluators import visible_gpus

    visible = visible_gpus()
    if not visible:
        raise ConfigError("no NVIDIA GPU is visible here (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES is empty); "
                          "evo run evaluates on a GPU: run it on a GPU machine, or with --ray ADDRESS on a cluster "
                          "with GPUs (evo seed and evo inspect work without one)")
    missing = [g for g in pool.gpus if g not in visible]
    if missing:
        raise ConfigError(f"--gpus: GPU(s) {missing} are not visible (visible: {visible})")


# -- operators ----------------------------------------------------------------------------------
#: Short names for groups of registered operators (``--operators knob,optuna``), with the share
#: of the group's weight each member gets. An alias wins over a registered operator of the same
#: name (the registry's ``knob`` is mutation alone; ``knob_mutation`` names that here).
ALIASES: dict[str, dict[str, float]] = {
    "knob": {"knob_mutation": 0.6, "knob_crossover": 0.3, "knob_random": 0.1},
    "optuna": {"tpe": 1.0},
}


def expand_operators(weights: Mapping[str, float]) -> dict[str, float]:
    """Aliases replaced by their members (weights split by the alias's shares, summed on overlap)."""
    out: dict[str, float] = {}
    for name, weight in weights.items():
        for member, share in ALIASES.get(name, {name: 1.0}).items():
            out[member] = out.get(member, 0.0) + weight * share
    return out


def known_model(name: str, files: Any = ()) -> None:
    """ValueError, at once and offline, for a model name that is neither a table name, a spec
    string (``openai:``, ``transformers:``, ``vllm:``) nor a local model folder: a bare unknown
    name would otherwise be tried as a hub id over the network."""
    from operators.llm import BACKENDS, load_models

    tables = load_models(*files)
    kind, sep, rest = name.strip().partition(":")
    if name.strip() in tables or (sep and kind in BACKENDS and rest) or Path(name).is_dir():
        return
    raise ValueError(f"unknown model {name!r}; known: {', '.join(sorted(tables))}; or a spec: openai:MODEL@URL, "
                     "transformers:PATH_OR_HUB_ID[@DEVICE], vllm:PATH (more tables: --llm-config FILE)")


def make_operators(weights: Mapping[str, float], llm: Optional[Mapping[str, Any]] = None) -> dict[str, Any]:
    """One operator instance per configured name (aliases expanded first by the caller); an
    unknown or uninstalled name is a ConfigError naming what is available or what to install.
    ``llm`` options go to the LLM operators (the names starting with ``llm``)."""
    from operators import get_operator, registered_operators

    known = registered_operators()
    out = {}
    for name in weights:
        if name not in known:
            raise ConfigError(f"operators: unknown operator {name!r}; known: {', '.join(sorted(set(ALIASES) | set(known)))}")
        try:
            out[name] = get_operator(name, **dict(llm or {})) if name.startswith("llm") else get_operator(name)
        except ImportError as exc:
            raise ConfigError(f"operators: {exc}") from None
    return out


# -- a run --------------------------------------------------------------------------------------
def run_search(cfg: RunConfig, *, llm: Optional[Mapping[str, Any]] = None, llm_device: Optional[str] = None,
               llm_adapter: Optional[str] = None, pool_factory: Optional[PoolFactory] = None,
               templates: Optional[Mapping[str, Template]] = None, progress_stream: Optional[TextIO] = None,
               open_archive: Callable[[str], Archive] = lambda path: Archive(path, "w"),
               log: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr, flush=True)) -> "RunResult":
    """Run the search ``cfg`` describes and return how it ended.

    Opens (or creates) ``cfg.archive`` as its only writer (``open_archive``), builds the operators (``llm``: options
    for the LLM operators) and the pool (``pool_factory``, default :func:`make_pool`; a pool it
    makes it also closes), places the LLM (``llm_device``, ``llm_adapter``), runs the engine with
    SIGINT/SIGTERM asking it to stop (when called on the main thread), and commits and closes
    everything however it ends. Bad input (a config, an operator, a busy or foreign archive, a
    pool that cannot start) raises ConfigError or ArchiveError before a search starts; a fresh
    archive that never saw a search is removed again."""
    from ..search import ensure_calibration
    from ..search import Engine, pool_gpus
    from ..search import EVENTS_FILE, EventLog, Progress

    cfg.operators = expand_operators(cfg.operators)
    operators = make_operators(cfg.operators, llm)
    templates = dict(templates) if templates is not None else load_templates(errors="warn")
    real_pool = pool_factory is None
    if real_pool:
        need_gpus(cfg.pool)  # before the archive: a run that cannot start creates nothing
    if cfg.archive is None:
        raise ConfigError("no archive: give one as the first argument, --archive or archive in the config")
    fresh = not Path(cfg.archive).exists()
    archive = open_archive(cfg.archive)
    pool: Optional[EvaluatorPool] = None
    engine = updater = None
    events = EventLog(Path(cfg.archive) / EVENTS_FILE)
    previous: dict[int, Any] = {}
    # the device's ceilings, measured once per GPU (cached) before the pool's workers use it
    calibration = ensure_calibration(cfg.archive, measure=real_pool and not cfg.pool.ray, log=log)
    try:
        try:
            pool = (pool_factory or make_pool)(cfg.pool)
        except Exception as exc:  # a bad pool setting, a worker that cannot start: say so, no traceback
            archive.close()
            events.close()
            if fresh:
                _remove_fresh(Path(cfg.archive))
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(f"cannot start the evaluator pool: {type(exc).__name__}: {exc}") from None
        progress = Progress(cfg.shapes, pool_gpus(pool, cfg), cfg.progress, cfg.progress_interval_s,
                            stream=progress_stream)
        lease = _place_llm(cfg, pool, operators, llm_device, events, progress)
        if llm_adapter:
            _load_adapter(llm_adapter, operators, events, progress)
        _warm_llm(operators, events, progress)
        # the run's budget clock starts here: after the LLM is loaded and warm, with or without an adapter
        engine = Engine(cfg, archive, pool, operators, templates, events=events, progress=progress,
                        calibration=calibration)
        if cfg.rl.every:
            updater = _rl_updater(cfg, operators, templates, events, progress)
            engine.callbacks.append(RLCallback(updater))  # after archive, record and tell
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, lambda signum, frame: engine.interrupt())
        result = engine.run()
        if lease is not None:
            events.emit("llm_lease", None, **lease.summary())
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        archive.close()  # the engine has committed; release the lock before a possibly slow pool shutdown
        if updater is not None:
            updater.close(cfg.rl.wait_s)
        events.close()
        if pool is not None:
            if engine is None or engine.lost > 0:
                pool.cancel_all()  # in-flight work was abandoned: closing must not wait for it
            pool.close()
    return result


def _remove_fresh(path: Path) -> None:
    """Remove an archive this run created and could not use (only evo's own files in it)."""
    import shutil

    from populations import LOCK, MANIFEST

    from ..search import EVENTS_FILE

    if path.is_dir() and set(os.listdir(path)) <= {LOCK, MANIFEST, EVENTS_FILE}:
        shutil.rmtree(path, ignore_errors=True)


class RLCallback(MeasureCallback):
    """``--rl-every``'s updater (``evo.rl.RLUpdater``) as the engine's last measure callback: it
    steps on the run's evaluation count once a batch is archived, committed and recorded; one
    that raises is dropped, the run goes on (not essential)."""

    def __init__(self, updater: "RLUpdater") -> None:
        self.updater = updater

    def apply(self, services: EngineServices, results: Sequence[Measured]) -> None:
        self.updater.step(services.budget.used_evals)

    def __repr__(self) -> str:
        return f"RLCallback({self.updater!r})"


def _rl_updater(cfg: RunConfig, operators: dict[str, Any], templates: Any, events: Any,
                progress: Any) -> "RLUpdater":
    """The RL updater of ``rl.every`` (evo.rl.RLUpdater); the run appends it as an :class:`RLCallback`."""
    from ..rl import GRPOConfig
    from ..rl import RLUpdater

    r = cfg.rl
    assert cfg.archive is not None
    if r.mode == "rank":
        from ..rl import RankConfig

        config: Any = RankConfig(steps=r.steps, seed=cfg.seed, holdout=0.0)  # its own lr: GRPO's 2e-3 is too high here
    else:
        config = GRPOConfig(steps=r.steps, group_size=r.group_size, lr=r.lr, seed=cfg.seed)
    return RLUpdater(cfg.archive, operators, templates, every=r.every, window=r.window, events=events,
                     log=progress.message, config=config)


def _place_llm(cfg: RunConfig, pool: "EvaluatorPool", operators: dict[str, Any], llm_device: Optional[str],
               events: Any, progress: Any) -> Any:
    """Report where the LLM runs (event ``llm_placement``) and hand a co-located model the GPU
    lease (evo/search/_llm_placement.py); returns the lease, or None."""
    from ..search import llm_placement, place_llm

    gpus = list(cfg.pool.gpus) or [int(g) for g in (pool.gpus or [0]) if isinstance(g, int)]
    placement = llm_placement(operators, gpus, llm_device)
    lease = place_llm(operators, placement)
    if placement.where != "none":
        events.emit("llm_placement", None, **placement.to_dict())
        progress.message(f"evo: {placement.describe()}")
    return lease


def _warm_llm(operators: dict[str, Any], events: Any, progress: Any) -> None:
    """Load and warm every LLM operator's models before the run (event ``llm_warm``): the first
    proposal of a run then costs what the others do, whether or not an adapter was loaded first,
    and the load is charged to no budget (issue 25: a lazily loaded model made no proposal in a
    short run)."""
    from operators import model_face

    for name, op in operators.items():
        t0 = time.monotonic()
        models = model_face(op).warm()
        if not models:  # an operator with nothing to load
            continue
        seconds = round(time.monotonic() - t0, 3)
        events.emit("llm_warm", None, operator=name, models=models, seconds=seconds)
        progress.message(f"evo: {name}: " + ", ".join(f"{m} {state}" for m, state in models.items())
                         + f" ({seconds:g} s, before the run's budget clock)")


def _load_adapter(folder: str, operators: dict[str, Any], events: Any, progress: Any) -> None:
    """Switch the LLM operators' local models to the adapter in ``folder`` (event ``adapter``)."""
    from ..rl import read_manifest, switch_adapter

    name = read_manifest(folder).name
    switched = switch_adapter(operators, folder, name)
    events.emit("adapter", None, name=name, folder=str(folder), models=switched, source="--llm-adapter")
    progress.message(f"evo: LLM adapter {name} loaded for {', '.join(switched) or 'no local model'}")
