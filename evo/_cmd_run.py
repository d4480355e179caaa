"""``evo run``: evolve kernels for one or more shapes into an archive (docs/run.md).

Flags override the optional ``--config run.toml``. Bad input exits 2 with one clear line;
a run stopped by Ctrl-C exits 130 (first press: in-flight work finishes, then the archive is
committed; second press: in-flight work is abandoned, the archive is committed); any other
stop (budget, convergence, nothing left to propose) exits 0.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

from ._cmd_args import (EXIT_INTERRUPTED, SHAPE_HELP, SHAPE_METAVAR, UsageError, add_archive,
                        add_gpus, add_json, archive_of, fail, open_writer, parse_gpus, resolve_arch)
from ._config import ConfigError, PoolConfig, RunConfig, load_config, merge

if TYPE_CHECKING:  # evaluators is imported when a pool is made, not at start-up
    from evaluators import EvaluatorPool

__all__ = ["add_parser", "run", "config_from_args", "make_pool", "make_operators", "expand_operators", "ALIASES"]



def add_parser(subparsers: Any) -> None:
    p = subparsers.add_parser("run", help="evolve kernels for shapes into an archive",
                              description="Evolve HGEMM kernels per shape; resumes when the archive exists.")
    add_archive(p, "archive directory (created, or resumed when it exists; or archive in the config file)")
    p.add_argument("--shape", action="append", dest="shapes", metavar=SHAPE_METAVAR, help=SHAPE_HELP + " (repeatable)")
    p.add_argument("--config", metavar="TOML", help="run configuration file; flags override it")
    p.add_argument("--budget", metavar="DURATION", help="wall-time budget, e.g. 20m, 1h30m, 90s")
    p.add_argument("--gpu-seconds", metavar="DURATION", help="GPU-time budget (correctness + timing), e.g. 600 or 10m")
    p.add_argument("--max-evals", type=int, metavar="N", help="evaluations in this run")
    p.add_argument("--max-tokens", type=int, metavar="N", help="LLM tokens in this run")
    p.add_argument("--operators", metavar="LIST", help="operators and weights, e.g. knob,optuna or knob:3,optuna:1")
    p.add_argument("--seed", type=int, help="random seed (default 0)")
    p.add_argument("--seeds-per-template", type=int, metavar="N",
                   help="cold start: candidates per applicable template, as evo seed makes them (default 4)")
    p.add_argument("--converge-window", type=int, metavar="N",
                   help="stop a shape after N evaluations without improving its best by more than the threshold")
    p.add_argument("--converge-threshold", type=float, metavar="FRACTION", help="relative improvement that counts (default 0.005)")
    add_gpus(p)
    p.add_argument("--compile-workers", type=int, metavar="N", help="CPU compile processes (default 4)")
    p.add_argument("--max-inflight", type=int, metavar="N", help="candidates in flight (default 2 x GPUs + compile workers)")
    p.add_argument("--ray", metavar="auto|ADDRESS",
                   help="evaluate on a Ray cluster: auto (the cluster on this machine, else a new local one) "
                        "or HEAD:6379 of a running cluster (default: the local pool)")
    p.add_argument("--arch", metavar="SM", help="target architecture: sm_80, sm_86, sm_89, sm_90a or auto "
                                                "(default: the pool's GPU)")
    p.add_argument("--progress", choices=("auto", "rich", "plain", "none"), help="live progress display")
    add_json(p, "the run's result (stop reason, evaluations, best per shape)")
    p.add_argument("--no-transfer", action="store_true", default=None,
                   help="do not seed new shapes from the elites of nearby archived shapes")
    p.add_argument("--operator-bandit", action="store_true", default=None,
                   help="choose operators by measured improvement per GPU-second (Thompson sampling; the LLM's "
                        "inference GPU time counts; each adapter version is its own arm) instead of fixed weights")
    add_llm_flags(p)
    p.add_argument("--rl-every", type=int, metavar="N",
                   help="every N evaluations, train the LLM operators' model with GRPO + LoRA on the archive's "
                        "newest LLM-made candidates (in the background) and switch to the new adapter")
    # Test-only: a `module:factory` evaluator pool (tests use fake_pool:FakeEvaluatorPool).
    p.add_argument("--pool", default=None, help=argparse.SUPPRESS)


def _gpus(text: Optional[str]) -> Optional[list[int]]:
    """--gpus as the pool's index list (count:N is the first N; None: the file's or every visible GPU)."""
    try:
        gpus = parse_gpus(text)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    return list(range(gpus)) if isinstance(gpus, int) else gpus


def _arch(text: Optional[str]) -> Optional[str]:
    if text is None or text.strip().lower() == "auto":
        return None if text is None else "auto"
    try:
        return resolve_arch(text)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run configuration: the file (if any) with the flags laid over it."""
    file_values = load_config(args.config) if args.config else {}
    try:
        archive = archive_of(args, required=False)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None
    pool = {k: v for k, v in {"gpus": _gpus(args.gpus), "compile_workers": args.compile_workers,
                                "max_inflight": args.max_inflight, "arch": _arch(args.arch), "kind": args.pool,
                                "ray": args.ray}.items()
            if v is not None}
    flags: dict[str, Any] = {
        "shapes": args.shapes, "archive": archive, "budget": args.budget, "gpu_seconds": args.gpu_seconds,
        "max_evals": args.max_evals, "max_tokens": args.max_tokens, "operators": args.operators,
        "seed": args.seed, "seeds_per_template": args.seeds_per_template,
        "converge_window": args.converge_window, "converge_threshold": args.converge_threshold,
        "progress": args.progress, "pool": pool or None,
        "transfer": {"enabled": False} if args.no_transfer else None,
        "bandit": {"enabled": True} if getattr(args, "operator_bandit", None) else None,
        "rl": {"every": args.rl_every} if getattr(args, "rl_every", None) is not None else None,
    }
    return merge(file_values, flags)


def make_pool(pool: PoolConfig) -> Any:
    """The evaluator pool: ``local`` is evaluators.LocalPool (evaluators.RayPool when ``pool.ray``
    names a cluster); ``module:factory`` is a test double."""
    common = {"gpus": pool.gpus or None, "compile_workers": pool.compile_workers,
              "max_in_flight": pool.max_inflight or None, "arch": None if pool.arch == "auto" else pool.arch,
              "worker_options": {"loader": pool.loader}}
    if pool.ray and pool.kind == "local":
        from evaluators import RayPool, RayUnavailable

        try:
            return RayPool(address=pool.ray, **common)
        except RayUnavailable as exc:
            raise ConfigError(f"--ray {pool.ray}: {exc}") from None
    if pool.kind == "local":
        from evaluators import LocalPool  # imported here, not at start-up: it may pull in CUDA bindings

        return LocalPool(**common)
    module, _, attr = pool.kind.partition(":")
    if not module or not attr:
        raise ConfigError(f"pool.kind: 'local' (or a test-only module:factory), got {pool.kind!r}")
    try:
        factory: Callable[[PoolConfig], Any] = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"pool.kind: cannot load {pool.kind!r}: {exc}") from None
    return factory(pool)


#: Short names for groups of registered operators (``--operators knob,optuna``), with the share
#: of the group's weight each member gets. An alias wins over a registered operator of the same
#: name (the registry's ``knob`` is mutation alone; ``knob_mutation`` names that here).
ALIASES: dict[str, dict[str, float]] = {
    "knob": {"knob_mutation": 0.6, "knob_crossover": 0.3, "knob_random": 0.1},
    "optuna": {"tpe": 1.0},
}


def expand_operators(weights: dict[str, float]) -> dict[str, float]:
    """Aliases replaced by their members (weights split by the alias's shares, summed on overlap)."""
    out: dict[str, float] = {}
    for name, weight in weights.items():
        for member, share in ALIASES.get(name, {name: 1.0}).items():
            out[member] = out.get(member, 0.0) + weight * share
    return out


def add_llm_flags(p: argparse.ArgumentParser) -> None:
    """The LLM operators' flags (``evo run``; operators/llm/models.toml says what a model name is)."""
    p.add_argument("--model", action="append", dest="models", metavar="NAME",
                   help="model for the LLM operators (repeat for several: a bandit picks per call); a name from "
                        "operators/llm/models.toml or --llm-config, or openai:MODEL@URL, transformers:PATH[@DEVICE], "
                        "vllm:PATH")
    p.add_argument("--llm-config", action="append", dest="llm_config", metavar="TOML",
                   help="extra model tables (same format as operators/llm/models.toml)")
    p.add_argument("--llm-device", metavar="DEVICE",
                   help="where the LLM runs: cpu, or cuda:N for in-process transformers models (and where a local "
                        "server or vLLM is declared to run); on one of the pool's GPUs generation waits for the timed "
                        "regions (a per-GPU lease), elsewhere no lease is needed (default: the model's device)")
    p.add_argument("--llm-threads", type=int, metavar="N", help="torch CPU threads for in-process models (default: torch's)")
    p.add_argument("--llm-adapter", metavar="DIR",
                   help="start the in-process LLM models on this evo rl adapter (a version folder with evo-adapter.json); "
                        "its version is recorded on every candidate they write")


def llm_options(args: argparse.Namespace) -> dict[str, Any]:
    """Options for the LLM operators from the flags; an unknown model or bad config is a ConfigError."""
    out: dict[str, Any] = {}
    if getattr(args, "models", None):
        out["models"] = list(dict.fromkeys(args.models))
    if getattr(args, "llm_config", None):
        out["model_config"] = list(args.llm_config)
    if getattr(args, "llm_device", None):
        out["device"] = args.llm_device
    if getattr(args, "llm_threads", None) is not None:
        out["threads"] = args.llm_threads
    if getattr(args, "llm_adapter", None):
        from .rl._adapters import read_manifest
        try:
            read_manifest(args.llm_adapter)
        except ValueError as exc:
            raise ConfigError(f"--llm-adapter: {exc}") from None
    if out.get("models") or out.get("model_config"):
        from operators.llm import resolve_model
        try:
            for m in out.get("models", ()):
                known_model(m, out.get("model_config", ()))
                resolve_model(m, out.get("model_config", ()))
        except (ValueError, OSError) as exc:
            raise ConfigError(f"--model: {exc}") from None
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


def make_operators(weights: dict[str, float], llm: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """One operator instance per configured name (aliases expanded); an unknown or uninstalled
    name is a ConfigError naming what is available or what to install. ``llm`` options go to the
    LLM operators (the names starting with ``llm``)."""
    from operators import get_operator, registered_operators

    known = registered_operators()
    out = {}
    for name in weights:
        if name not in known:
            raise ConfigError(f"operators: unknown operator {name!r}; known: {', '.join(sorted(set(ALIASES) | set(known)))}")
        try:
            out[name] = get_operator(name, **(llm or {})) if name.startswith("llm") else get_operator(name)
        except ImportError as exc:
            raise ConfigError(f"operators: {exc}") from None
    return out


def _need_gpus(pool: PoolConfig) -> None:
    """ConfigError, before anything is created, when the local pool would have no GPU to use."""
    if pool.kind != "local" or pool.ray:
        return  # a test double, or a Ray cluster whose GPUs may be on other nodes
    from evaluators import visible_gpus

    visible = visible_gpus()
    if not visible:
        raise ConfigError("no NVIDIA GPU is visible here (nvidia-smi lists none, or CUDA_VISIBLE_DEVICES is empty); "
                          "evo run evaluates on a GPU: run it on a GPU machine, or with --ray ADDRESS on a cluster "
                          "with GPUs (evo seed and evo inspect work without one)")
    missing = [g for g in pool.gpus if g not in visible]
    if missing:
        raise ConfigError(f"--gpus: GPU(s) {missing} are not visible (visible: {visible})")


def _remove_fresh(path: Path) -> None:
    """Remove an archive this run created and could not use (only evo's own files in it)."""
    import shutil

    from populations import LOCK, MANIFEST

    from ._progress import EVENTS_FILE

    if path.is_dir() and set(os.listdir(path)) <= {LOCK, MANIFEST, EVENTS_FILE}:
        shutil.rmtree(path, ignore_errors=True)


def _close_pool(pool: "EvaluatorPool", abandon: bool) -> None:
    """Close the pool; when in-flight work was abandoned, first ask it to drop that work
    (``cancel_all()``) so closing does not wait for it."""
    if abandon:
        pool.cancel_all()
    pool.close()


def _rl_updater(cfg: RunConfig, operators: dict[str, Any], templates: Any, events: Any, progress: Any) -> Any:
    """The engine hook of ``--rl-every`` (evo.rl.RLUpdater)."""
    from .rl._grpo import GRPOConfig
    from .rl._updater import RLUpdater

    r = cfg.rl
    assert cfg.archive is not None
    return RLUpdater(cfg.archive, operators, templates, every=r.every, window=r.window, events=events,
                     log=progress.message, config=GRPOConfig(steps=r.steps, group_size=r.group_size, lr=r.lr,
                                                             seed=cfg.seed))


def _place_llm(args: argparse.Namespace, cfg: RunConfig, pool: "EvaluatorPool", operators: dict[str, Any], events: Any,
               progress: Any) -> Any:
    """Report where the LLM runs (event ``llm_placement``) and hand a co-located model the GPU
    lease (evo/_llm_placement.py); returns the lease, or None."""
    from ._llm_placement import llm_placement, place_llm

    gpus = list(cfg.pool.gpus) or [int(g) for g in (pool.gpus or [0]) if isinstance(g, int)]
    placement = llm_placement(operators, gpus, getattr(args, "llm_device", None))
    lease = place_llm(operators, placement)
    if placement.where != "none":
        events.emit("llm_placement", None, **placement.to_dict())
        progress.message(f"evo: {placement.describe()}")
    return lease


def _load_adapter(folder: str, operators: dict[str, Any], events: Any, progress: Any) -> None:
    """``--llm-adapter``: switch the LLM operators' local models to the adapter (event ``adapter``)."""
    from .rl._adapters import read_manifest, switch_adapter

    name = read_manifest(folder)["name"]
    switched = switch_adapter(operators, folder, name)
    events.emit("adapter", None, name=name, folder=str(folder), models=switched, source="--llm-adapter")
    progress.message(f"evo: LLM adapter {name} loaded for {', '.join(switched) or 'no local model'}")


def run(args: argparse.Namespace) -> int:
    from populations import load_templates
    from populations import ArchiveError

    from ._calibration import ensure_calibration
    from ._engine import Engine, pool_gpus
    from ._progress import EVENTS_FILE, EventLog, Progress

    try:
        cfg = config_from_args(args)
        cfg.operators = expand_operators(cfg.operators)
        operators = make_operators(cfg.operators, llm_options(args))
        templates = load_templates(errors="warn")
        _need_gpus(cfg.pool)  # before the archive: a run that cannot start creates nothing
        fresh = not Path(cfg.archive).exists()  # type: ignore[arg-type]
        archive = open_writer("run", cfg.archive)
    except (ConfigError, ArchiveError) as exc:
        return fail("run", exc)
    assert cfg.archive is not None
    pool = engine = updater = None
    events = EventLog(Path(cfg.archive) / EVENTS_FILE)
    previous = {}
    # the device's ceilings, measured once per GPU (cached) before the pool's workers use it
    calibration = ensure_calibration(cfg.archive, measure=cfg.pool.kind == "local" and not cfg.pool.ray,
                                     log=lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        try:
            pool = make_pool(cfg.pool)
        except Exception as exc:  # a bad pool setting, a worker that cannot start: say so, no traceback
            archive.close()
            events.close()
            if fresh:
                _remove_fresh(Path(cfg.archive))
            what = exc if isinstance(exc, ConfigError) else f"cannot start the evaluator pool: {type(exc).__name__}: {exc}"
            return fail("run", what)
        progress = Progress(cfg.shapes, pool_gpus(pool, cfg), cfg.progress, cfg.progress_interval_s,
                            stream=sys.stderr if getattr(args, "json", False) else None)  # stdout: the JSON alone
        engine = Engine(cfg, archive, pool, operators, templates, events=events, progress=progress,
                        calibration=calibration)
        if cfg.rl.every:
            updater = _rl_updater(cfg, operators, templates, events, progress)
            engine.hooks.append(updater)
        lease = _place_llm(args, cfg, pool, operators, events, progress)
        if getattr(args, "llm_adapter", None):
            _load_adapter(args.llm_adapter, operators, events, progress)

        def on_signal(signum: int, frame: Any) -> None:
            engine.interrupt()

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, on_signal)
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
            _close_pool(pool, abandon=engine is None or engine.lost > 0)
    if getattr(args, "json", False):
        import json

        json.dump({"format": "evo-run/1", "archive": str(cfg.archive), "reason": result.reason,
                   "evaluations": result.evaluations, "abandoned": result.lost,
                   "best": {str(s): b for s, b in result.best.items()}}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return EXIT_INTERRUPTED if result.reason in ("interrupted", "abandoned") else 0
    best = ", ".join(f"{s} {b:.3f}x" if b is not None else f"{s} -" for s, b in result.best.items())
    print(f"evo run: stopped ({result.reason}) after {result.evaluations} evaluation(s), "
          f"{result.lost} abandoned; best: {best}", flush=True)
    return EXIT_INTERRUPTED if result.reason in ("interrupted", "abandoned") else 0
