"""``evo run``: evolve kernels for one or more shapes into an archive (docs/run.md).

Flags override the optional ``--config run.toml``. Bad input exits 2 with one clear line;
a run stopped by Ctrl-C exits 130 (first press: in-flight work finishes, then the archive is
committed; second press: in-flight work is abandoned, the archive is committed); any other
stop (budget, convergence, nothing left to propose) exits 0.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

from ._cmd_args import (EXIT_INTERRUPTED, SHAPE_HELP, SHAPE_METAVAR, UsageError, add_archive,
                        add_gpus, add_json, archive_of, fail, gpu_list, open_writer, resolve_arch)
from ..search import ConfigError, RunConfig, load_config, merge
from ._orchestrate import PoolFactory, known_model, run_search

__all__ = ["add_parser", "run", "config_from_args", "add_llm_flags", "llm_options"]



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
    p.add_argument("--rl-mode", choices=("grpo", "rank"), default=None,
                   help="with --rl-every: grpo (default) trains the generator on LLM-made children; rank trains the "
                        "model as a ranker (evo rl rank) on every operator's measured pairs, for --operators llm_ranked")


def _gpus(text: Optional[str]) -> Optional[list[int]]:
    """--gpus as the pool's index list (count:N is the first N; None: the file's or every visible GPU)."""
    try:
        return gpu_list(text)
    except UsageError as exc:
        raise ConfigError(str(exc)) from None


def _arch(text: Optional[str]) -> Optional[str]:
    if text is None or text.lower() == "auto":
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
                                "max_inflight": args.max_inflight, "arch": _arch(args.arch),
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
        "rl": ({k: v for k, v in {"every": getattr(args, "rl_every", None), "mode": getattr(args, "rl_mode", None)}.items()
                if v is not None} or None),
    }
    return merge(file_values, flags)


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
    p.add_argument("--llm-batch", type=int, metavar="N",
                   help="knob edits the LLM operators sample together per call (one prefill, one forward pass per "
                        "step for all N; default: operators/settings.toml's batch)")
    p.add_argument("--llm-adapter", metavar="DIR",
                   help="start the in-process LLM models on this evo rl adapter (a version folder with evo-adapter.json); "
                        "its version is recorded on every candidate they write")


#: The most CPU threads an in-process model is given (beyond any real machine: a typo guard).
MAX_THREADS = 4096


def llm_options(args: argparse.Namespace) -> dict[str, Any]:
    """Options for the LLM operators from the flags; an unknown model or bad config is a ConfigError."""
    out: dict[str, Any] = {}
    if getattr(args, "models", None):
        out["models"] = list(dict.fromkeys(args.models))
    if getattr(args, "llm_config", None):
        out["model_config"] = list(args.llm_config)
    if getattr(args, "llm_device", None) is not None:
        out["device"] = args.llm_device
    if getattr(args, "llm_threads", None) is not None:
        if not 1 <= args.llm_threads <= MAX_THREADS:
            raise ConfigError(f"--llm-threads must be between 1 and {MAX_THREADS}, got {args.llm_threads}")
        out["threads"] = args.llm_threads
    if getattr(args, "llm_batch", None) is not None:
        if args.llm_batch < 1:
            raise ConfigError(f"--llm-batch must be >= 1, got {args.llm_batch}")
        out["batch"] = args.llm_batch
    if getattr(args, "llm_adapter", None):
        from ..rl import read_manifest
        try:
            read_manifest(args.llm_adapter)
        except ValueError as exc:
            raise ConfigError(f"--llm-adapter: {exc}") from None
    _check_llm_choices(out)
    return out


def _check_llm_choices(out: dict[str, Any]) -> None:
    """ConfigError, before any work starts, for LLM choices that cannot work: a config file missing
    or malformed, a device that is not there, a model path without a model, a server that does not
    parse or answer (operators.llm.check_spec)."""
    from operators.llm import check_device, check_spec, load_models, resolve_model

    files = out.get("model_config", ())
    if files:
        try:
            load_models(*files)
        except (ValueError, OSError) as exc:
            raise ConfigError(f"--llm-config: {exc}") from None
    visible = None
    if "device" in out or out.get("models"):
        from evaluators import visible_gpus

        visible = len(visible_gpus())
    if "device" in out:
        try:
            check_device(out["device"], visible)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(f"--llm-device: {exc}") from None
    try:
        for m in out.get("models", ()):
            known_model(m, files)
            check_spec(resolve_model(m, files, device=out.get("device")), visible_gpus=visible)
    except (ValueError, OSError) as exc:
        raise ConfigError(f"--model: {exc}") from None


def run(args: argparse.Namespace, *, pool_factory: Optional[PoolFactory] = None) -> int:
    """``evo run``: the flags as a RunConfig, then :func:`evo.cli._orchestrate.run_search`, then the
    result printed. ``pool_factory``: the evaluator pool to use instead of the GPUs' (for programs
    that embed the command line, as the tests do with their stand-in pool)."""
    from populations import ArchiveError

    as_json = bool(getattr(args, "json", False))
    try:
        cfg = config_from_args(args)
        result = run_search(cfg, llm=llm_options(args), llm_device=getattr(args, "llm_device", None),
                            llm_adapter=getattr(args, "llm_adapter", None), pool_factory=pool_factory,
                            progress_stream=sys.stderr if as_json else None,  # stdout: the JSON alone
                            open_archive=lambda path: open_writer("run", path))
    except (ConfigError, ArchiveError) as exc:
        return fail("run", exc)
    if as_json:
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
