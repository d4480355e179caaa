"""The RL dataset: every LLM-made candidate of some archives as a (prompt, completion, reward) row.

Rows are what trl and other trainers read (JSON lines, one object per line): ``prompt`` is the
chat the model saw (a list of ``{"role", "content"}`` messages, trl's conversational format),
``completion`` its answer as one assistant message, ``reward`` the measured outcome
(:func:`evo.rl.reward_of`). The other columns say where the row came from (``shape``,
``model``, ``adapter``, ``parent``, ``candidate``, ``template``, ``knobs``, ``parent_knobs``,
``status``, ``fitness``) and ``group`` = parent and shape: completions written for one parent at
one shape answer the same question, so GRPO's group-relative ``advantage`` (reward minus the
group's mean, over its standard deviation; 0 in a group of one) is computed within it.
Candidates not evaluated yet (in flight) are left out.
"""
from __future__ import annotations

import json
import math
import os
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, Union

from populations import Archive, Candidate, Evaluation, Shape

from ._reward import RewardConfig, improvement_of, reward_of

__all__ = ["export_rows", "write_jsonl", "read_jsonl", "messages_of", "group_advantages", "DatasetError"]

_ROLE = re.compile(r"(?:^|\n\n)\[(system|user|assistant)\]\n")


class DatasetError(ValueError):
    """A dataset file that cannot be read as RL rows."""


def messages_of(transcript: str) -> list[dict[str, str]]:
    """Chat messages back from the operator's transcript (``[role]\\ncontent`` blocks joined by a
    blank line, what ``Candidate.prompt`` holds)."""
    parts = _ROLE.split(transcript)
    if len(parts) < 3 or parts[0].strip():
        return [{"role": "user", "content": transcript}]
    return [{"role": parts[i], "content": parts[i + 1]} for i in range(1, len(parts) - 1, 2)]


def _row(cand: Candidate, shape: Shape, evals: list[Evaluation], parent: Optional[Candidate],
         config: RewardConfig, parent_evals: Sequence[Evaluation] = ()) -> Optional[dict[str, Any]]:
    reward = improvement_of(evals, parent_evals, config) if config.kind == "improvement" else reward_of(evals, config)
    if reward is None:
        return None
    fits = [e.fitness for e in evals if e.fitness is not None]
    return {
        "prompt": messages_of(cand.prompt or ""),
        "completion": [{"role": "assistant", "content": cand.completion or ""}],
        "reward": reward,
        "group": f"{cand.parents[0] if cand.parents else '-'}|{shape}",
        "shape": str(shape), "model": cand.model, "adapter": cand.adapter, "operator": cand.operator,
        "parent": cand.parents[0] if cand.parents else None, "parents": list(cand.parents),
        "candidate": cand.id, "template": cand.template, "generic": cand.generic,
        "knobs": dict(cand.knobs) if cand.knobs is not None else None,
        "parent_knobs": dict(parent.knobs) if parent is not None and parent.knobs is not None else None,
        "mode": cand.meta.get("mode"), "status": evals[-1].status.value,
        "fitness": statistics.median(fits) if fits else None, "created": cand.created,
    }


def shape_records(archive: Archive, shape: Shape) -> tuple[dict[str, Candidate], dict[str, list[Evaluation]]]:
    """An archive's candidates at ``shape`` by id, and their evaluations there, in order, by id."""
    cands = {c.id: c for c in archive.candidates(shape)}
    evals: dict[str, list[Evaluation]] = defaultdict(list)
    for ev in archive.evaluations(shape):
        evals[ev.candidate_id].append(ev)
    return cands, evals


def export_rows(archives: Iterable[Archive], *, config: RewardConfig = RewardConfig(), since: float = 0.0,
                last: Optional[int] = None) -> list[dict[str, Any]]:
    """Rows for every evaluated LLM-made candidate (it has a model, a prompt and a completion)
    created at or after ``since`` (a time.time() value), the newest ``last`` of them when given,
    sorted by group then creation time, with group advantages filled in."""
    rows: list[dict[str, Any]] = []
    for archive in archives:
        for shape in archive.shapes():
            cands, evals = shape_records(archive, shape)
            for cand in cands.values():
                if not (cand.model and cand.prompt and cand.completion is not None) or cand.created < since:
                    continue
                parent = None
                if cand.parents:
                    parent = cands.get(cand.parents[0])
                    if parent is None:
                        try:
                            parent = archive.candidate(cand.parents[0])
                        except KeyError:
                            parent = None
                row = _row(cand, shape, evals.get(cand.id, []), parent, config,
                           evals.get(cand.parents[0], []) if cand.parents else [])
                if row is not None:
                    rows.append(row)
    if last is not None:
        rows = sorted(rows, key=lambda r: r["created"])[-last:] if last > 0 else []
    rows.sort(key=lambda r: (r["group"], r["created"]))
    group_advantages(rows)
    return rows


def group_advantages(rows: Sequence[dict[str, Any]]) -> None:
    """Set each row's ``advantage`` (and ``group_size``): reward standardised within its group."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r["group"]].append(r)
    for members in groups.values():
        rewards = [m["reward"] for m in members]
        mean = statistics.fmean(rewards)
        std = statistics.pstdev(rewards) if len(rewards) > 1 else 0.0
        for m in members:
            m["advantage"] = (m["reward"] - mean) / std if std > 1e-12 else 0.0
            m["group_size"] = len(members)


def write_jsonl(rows: Iterable[dict[str, Any]], path: Union[str, os.PathLike]) -> int:
    """Write rows as JSON lines (through a temporary file renamed into place); returns the count."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(21, "is a directory; --out names the dataset file, e.g. runs/rl.jsonl", str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    n = 0
    try:
        with open(tmp, "w") as fh:
            for r in rows:
                fh.write(json.dumps(r, sort_keys=True, allow_nan=False) + "\n")
                n += 1
        os.replace(tmp, path)
    except BaseException:  # nothing half-written is left behind, at the path or beside it
        tmp.unlink(missing_ok=True)
        raise
    return n


def read_jsonl(path: Union[str, os.PathLike]) -> list[dict[str, Any]]:
    """Rows of a dataset file; a line that is not a row with prompt, completion and reward is an error."""
    out = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise DatasetError(f"cannot read dataset {path}: {exc}") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{i}: not JSON: {exc}") from None
        if not isinstance(row, dict) or not {"prompt", "completion", "reward"} <= set(row):
            raise DatasetError(f"{path}:{i}: a row needs prompt, completion and reward")
        if not isinstance(row["reward"], (int, float)) or not math.isfinite(row["reward"]):
            raise DatasetError(f"{path}:{i}: reward must be a finite number")
        out.append(row)
    return out


def iter_groups(rows: Iterable[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[r.get("group", "-")].append(r)
    yield from groups.items()
