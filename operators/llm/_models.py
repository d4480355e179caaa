"""Model configuration as data: which backend serves a model name, and with what settings.

Names come from ``operators/llm/models.toml`` (and from extra TOML files given to
:func:`load_models`, e.g. ``evo run --llm-config FILE``). A name not in a table may be a spec
string: ``openai:MODEL@URL``, ``transformers:MODEL[@DEVICE]`` or ``vllm:MODEL``; anything else
is a transformers model (a local folder or a known local name). :func:`get_backend` builds each
spec's backend once per process, so several operators (``llm``, ``llm_crossover``) share it.
"""
from __future__ import annotations

import functools
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

from populations import Registry

from ._base import LLMBackend
from ._spec import BACKENDS, LLM_BACKENDS, ModelSpec

__all__ = ["ModelSpec", "MODELS_FILE", "BACKENDS", "LLM_BACKENDS", "load_models", "resolve_model", "get_backend",
           "SPEC_STRINGS", "spec_string"]

MODELS_FILE = Path(__file__).with_name("models.toml")
_KEYS = {"backend", "model", "device", "threads", "base_url", "api_key_env", "timeout_s", "retries", "backoff_s",
         "concurrency", "structured", "lora", "temperature", "price", "max_model_len"}


def _spec(name: str, table: Mapping[str, Any], where: str) -> ModelSpec:
    unknown = set(table) - _KEYS
    if unknown:
        raise ValueError(f"{where}: [{name}] has unknown keys {sorted(unknown)}; allowed: {sorted(_KEYS)}")
    values = dict(table)
    if "temperature" in values:
        t = values["temperature"]
        values["temperature"] = (float(t), float(t)) if isinstance(t, (int, float)) else tuple(float(x) for x in t)
    return ModelSpec(name=name, **values)


def _read(path: str) -> dict[str, ModelSpec]:
    st = Path(path).stat()
    return _read_cached(path, st.st_mtime_ns, st.st_size)  # an edited file is read again


@functools.lru_cache(maxsize=16)
def _read_cached(path: str, mtime_ns: int, size: int) -> dict[str, ModelSpec]:
    from populations import load_toml

    data = load_toml(path, 4 << 20, "model configuration")  # bounded: a FIFO or a device is refused, not read
    bad = [name for name, table in data.items() if not isinstance(table, dict)]
    if bad:
        raise ValueError(f"{path}: {bad[0]!r} is not a [table] of model settings")
    return {name: _spec(name, table, path) for name, table in data.items()}


def load_models(*files: Union[str, Path]) -> dict[str, ModelSpec]:
    """The model tables: ``models.toml`` first, then each file (a later table replaces a name)."""
    out = dict(_read(str(MODELS_FILE)))
    for f in files:
        if not Path(f).exists():
            raise ValueError(f"model configuration {f} does not exist")
        out.update(_read(str(Path(f).resolve())))
    return out


def resolve_model(name: str, files: Sequence[Union[str, Path]] = (), **overrides: Any) -> ModelSpec:
    """The spec of ``name`` (a table name or a spec string), with ``overrides`` (e.g. device) laid over it."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a model name must be a non-empty string, got {name!r}")
    name = name.strip()
    tables = load_models(*files)
    if name in tables:
        spec = tables[name]
    else:
        kind, sep, rest = name.partition(":")
        if sep and kind in LLM_BACKENDS and rest:  # a spec string BACKEND:REST, read by its backend's parser
            spec = (SPEC_STRINGS.create(kind, name, rest) if kind in SPEC_STRINGS
                    else ModelSpec(name=name, backend=kind, model=rest))
        else:
            spec = ModelSpec(name=name, backend="transformers", model=name)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    if "device" in overrides and spec.backend != "transformers":
        overrides.pop("device")  # a device choice concerns in-process transformers models only
    return replace(spec, **overrides) if overrides else spec


#: How a spec string ``BACKEND:REST`` becomes a spec, per backend: a parser ``parse(name, rest)``
#: in the project's one registry pattern (:class:`populations.Registry`, as ``LLM_BACKENDS``). A
#: registered backend without a parser reads REST as the model (``vllm:MODEL``); a plug-in backend
#: adds its own form with :func:`spec_string`, as the built-ins below do, instead of a branch here.
SPEC_STRINGS: Registry[ModelSpec] = Registry("model spec string")


def spec_string(backend: str) -> Callable[[Callable[[str, str], ModelSpec]], Callable[[str, str], ModelSpec]]:
    """Register (as a decorator) the parser of ``backend``'s spec strings (see :data:`SPEC_STRINGS`)."""
    return SPEC_STRINGS.register(backend)


@spec_string("openai")
def _openai_spec(name: str, rest: str) -> ModelSpec:
    model, at, url = rest.rpartition("@")
    if not at or not model:
        raise ValueError(f"model {name!r}: write openai:MODEL@URL, e.g. openai:qwen@http://127.0.0.1:8000/v1")
    return ModelSpec(name=name, backend="openai", model=model, base_url=url)


@spec_string("transformers")
def _transformers_spec(name: str, rest: str) -> ModelSpec:
    model, _, device = rest.partition("@")
    return ModelSpec(name=name, backend="transformers", model=model, device=device or "cpu")


_BACKENDS: dict[ModelSpec, LLMBackend] = {}
_FAILED: dict[ModelSpec, Exception] = {}
_LOCK = threading.Lock()


def get_backend(spec: ModelSpec) -> LLMBackend:
    """The backend serving ``spec``, built once per process (loading a model takes tens of seconds).
    A model that failed to load fails again at once (the same exception), not after another load."""
    with _LOCK:
        backend = _BACKENDS.get(spec)
        if backend is not None:
            return backend
        if spec in _FAILED:
            raise _FAILED[spec]
        try:
            backend = _build(spec)
        except Exception as exc:
            _FAILED[spec] = exc
            raise
        _BACKENDS[spec] = backend
        return backend


def _build(spec: ModelSpec) -> LLMBackend:
    return LLM_BACKENDS.create(spec.backend, spec)


@LLM_BACKENDS.register("transformers")
def _transformers(spec: ModelSpec) -> LLMBackend:
    from ._transformers import load_backend
    return load_backend(spec.model, spec.device, spec.threads)


@LLM_BACKENDS.register("openai")
def _openai(spec: ModelSpec) -> LLMBackend:
    from ._openai import OpenAIBackend
    return OpenAIBackend(spec)


@LLM_BACKENDS.register("vllm")
def _vllm(spec: ModelSpec) -> LLMBackend:
    from ._vllm import VLLMBackend
    return VLLMBackend(spec)
