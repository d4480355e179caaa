"""Versioned adapters: training one into a folder with its manifest, the store of versions
beside an archive, and switching LLM operators to a version without a restart.

A version folder holds peft's ``adapter_config.json`` and ``adapter_model.safetensors`` and
``evo-adapter.json``, an :class:`evo.rl._manifest.AdapterManifest`: ``version`` (N), ``name``
(``vN-<first 12 hex of the adapter hash>``, what new candidates record as ``Candidate.adapter``),
``seed``, ``base_model`` and its ``base_model_hash``, ``adapter_hash``, ``parent_adapter``, the
training ``config`` (GRPO, LoRA, rewards), the ``dataset`` it saw (rows, groups, sha256) and
per-step ``metrics``.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from populations import Template

from ._grpo import GRPOConfig, RewardSource, add_elite_demos, prompts_from_rows, train
from ._manifest import MANIFEST, AdapterManifest
from ._policy import LoraSettings, Policy
from ._reward import RewardConfig, RewardTable

__all__ = ["MANIFEST", "AdapterManifest", "AdapterStore", "version_name", "read_manifest", "train_adapter",
           "switch_adapter", "backends_of", "table_from_rows"]

_VERSION_DIR = re.compile(r"^v(\d+)$")


def version_name(version: int, adapter_hash: str) -> str:
    return f"v{version}-{adapter_hash[:12]}"


def read_manifest(folder: Union[str, os.PathLike]) -> AdapterManifest:
    """The adapter version in ``folder``; ValueError (one line) when there is none."""
    return AdapterManifest.read(folder)


class AdapterStore:
    """``ROOT/v1``, ``ROOT/v2``, ...: the adapters one run trained (``ARCHIVE/adapters``)."""

    def __init__(self, root: Union[str, os.PathLike]) -> None:
        self.root = Path(root)

    def versions(self) -> list[int]:
        if not self.root.is_dir():
            return []
        return sorted(int(m.group(1)) for p in self.root.iterdir()
                      if (m := _VERSION_DIR.match(p.name)) and (p / MANIFEST).is_file())

    def latest(self) -> Optional[tuple[int, Path]]:
        v = self.versions()
        return (v[-1], self.root / f"v{v[-1]}") if v else None

    def folder(self, version: int) -> Path:
        return self.root / f"v{version}"


def table_from_rows(rows: Iterable[Mapping[str, Any]], config: RewardConfig = RewardConfig()) -> RewardTable:
    """Rewards the dataset itself carries (its candidates' ids at their shapes)."""
    from populations import Shape

    table = RewardTable(config)
    for r in rows:
        if r.get("candidate") and r.get("shape"):
            table.set(Shape.parse(r["shape"]), r["candidate"], float(r["reward"]))
    return table


def _rows_digest(rows: Sequence[Mapping[str, Any]]) -> str:
    h = hashlib.sha256()
    for r in rows:
        h.update(json.dumps(r, sort_keys=True).encode())
    return h.hexdigest()


def train_adapter(rows: Sequence[Mapping[str, Any]], out: Union[str, os.PathLike], *, policy: Policy,
                  templates: Mapping[str, Template], table: Optional[RewardTable] = None,
                  evaluate: Optional[Callable[..., Any]] = None, evaluate_many: Optional[Callable[..., Any]] = None,
                  config: GRPOConfig = GRPOConfig(),
                  version: int = 1, parent_adapter: Optional[str] = None,
                  log: Optional[Callable[[str], None]] = None, deadline: Optional[float] = None,
                  demos: Sequence[Any] = (), demos_top: int = 4) -> AdapterManifest:
    """Train ``policy`` on ``rows`` with GRPO, save the adapter into ``out`` with its manifest; the
    manifest. ``demos`` (archives) add each group's best ``demos_top`` archived children of its
    parent to the replayed completions (evo.rl._grpo.add_elite_demos). ``evaluate`` (one
    candidate) and ``evaluate_many`` (a list, evaluated side by side) measure sampled edits the
    table has no reward for (the GPU in the loop)."""
    prompts, skipped = prompts_from_rows(rows, templates)
    table = table if table is not None else table_from_rows(rows)
    for archive in demos if demos_top > 0 else ():
        prompts = add_elite_demos(prompts, archive, table, demos_top, config.max_changes)
    source = RewardSource(table, evaluate, evaluate_many)
    start = time.time()
    history = train(policy, prompts, source, config, log=log, deadline=deadline)
    digest = policy.save(out)
    manifest = AdapterManifest(
        version=version, name=version_name(version, digest),
        seed=config.seed, base_model=policy.backend.name, base_model_hash=policy.base_hash,
        adapter_hash=digest, parent_adapter=parent_adapter,
        config={"grpo": config.to_dict(), **policy.settings(), "reward": table.config.to_dict()},
        dataset={"rows": len(rows), "groups": len(prompts), "skipped": dict(skipped), "sha256": _rows_digest(rows),
                 "replay_texts": sum(len(p.replay) for p in prompts)},
        reward_sources=dict(source.sources), train_seconds=round(time.time() - start, 2),
        metrics=tuple({k: v for k, v in h.items() if k != "completions"} for h in history),
        created=time.time(),
    )
    manifest.write(out)
    return manifest


def backends_of(operators: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(model name, loaded backend) of every LLM operator's models (loading them if needed): the
    process-wide backend objects the operators answer with."""
    return [(m, backend) for m, backend, _ in _backends_and_gates(operators)]


def gate_of(operators: Mapping[str, Any]) -> Any:
    """The GPU lease the LLM operators generate under: given only when their model shares a
    timing GPU (evo/search/_llm_placement.py), else None. GPU work for them (training the policy,
    loading an adapter) holds slices of it too."""
    return next((g for _, _, g in _backends_and_gates(operators) if g is not None), None)


def _backends_and_gates(operators: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    from operators.llm import get_backend

    out = []
    for op in operators.values():
        models = getattr(op, "models", None)
        spec_of = getattr(op, "_spec", None)
        if models and callable(spec_of):
            out.extend((m, get_backend(spec_of(m)), getattr(op, "gate", None)) for m in models)
    return out


def switch_adapter(operators: Mapping[str, Any], folder: Union[str, os.PathLike, None], name: str) -> list[str]:
    """Point every LLM operator's local transformers backend at the adapter in ``folder`` (recorded
    as ``name`` on new candidates; None: back to the base model); the model names switched.
    Backends that refuse (``LLMBackend.load_adapter``'s NotImplementedError: those without
    adapter support) are left as they are. A model that shares a timing GPU loads inside a slice
    of its operator's lease."""
    switched, done = [], set()
    for m, backend, gate in _backends_and_gates(operators):
        if id(backend) in done:  # one backend serving two operators (mutation and crossover)
            switched.append(m)
            continue
        try:
            backend.load_adapter(folder, name, gate=gate)
        except NotImplementedError:
            continue
        done.add(id(backend))
        switched.append(m)
    return switched
