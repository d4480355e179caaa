"""Periodic RL updates inside ``evo run`` (``--rl-every N``).

:class:`RLUpdater` steps on the engine's thread after each batch of results (``evo run`` wraps it
in one of the engine's measure callbacks, after the results are archived and committed).
Every ``every`` evaluations it starts one background training round (never two at once): export
the newest ``window`` LLM-made rows of the archive (read through a separate reader, so the
engine keeps writing), train the policy ``steps`` GRPO steps on them with the archive as reward
source (and each group's best archived children of its parent replayed as demonstrations,
whatever operator made them), and save adapter ``vN+1`` under ``ARCHIVE/adapters``. When a round has finished, the
next step (on the engine's thread again) switches the LLM operators to the new adapter
and emits an ``rl_update`` event. A round that fails emits ``rl_failed`` with the error and the
run goes on; rounds with no trainable rows are skipped (``rl_skip``). With a
:class:`~evo.rl._rank.RankConfig` (``--rl-mode rank``) a round trains the model as a ranker
instead (``evo rl rank`` on the newest ``window`` pairs of every operator, no shape held out), for
the ``llm_ranked`` operator's scorer, which shares the model and so switches with it. The policy is created on
the first round (a copy of the operator's model) and keeps training from round to round; a
resumed run continues from the newest adapter in the store and switches the operators to it
when the updater is made, before the run's first proposal.
"""
from __future__ import annotations

import threading
import traceback
from pathlib import Path
from typing import Any, Mapping, Optional, Union

from populations import Archive, Template

from ._adapters import AdapterStore, read_manifest, switch_adapter, train_adapter
from ._dataset import export_rows
from ._grpo import GRPOConfig
from ._pairs import export_pairs
from ._rank import RankConfig, rank_groups, train_rank_adapter
from ._reward import RewardTable

__all__ = ["RLUpdater"]


class RLUpdater:
    """See the module docstring."""

    def __init__(self, archive: Path, operators: Mapping[str, Any], templates: Mapping[str, Template], *,
                 every: int, config: Union[GRPOConfig, RankConfig] = GRPOConfig(steps=4), window: int = 256,
                 model: Optional[str] = None, events: Any = None, log: Any = None) -> None:
        if every < 1:
            raise ValueError("every must be >= 1")
        self.archive = Path(archive)
        self.operators, self.templates = operators, templates
        self.every, self.config, self.window = every, config, window
        self.model = model or next((getattr(op, "model") for op in operators.values()
                                    if getattr(op, "models", None)), None)
        self.events, self.log = events, log or (lambda msg: None)
        self.store = AdapterStore(self.archive / "adapters")
        self.next_at = every
        self.policy: Any = None
        self._thread: Optional[threading.Thread] = None
        self._result: Optional[dict[str, Any]] = None
        latest = self.store.latest()
        self.version, self.current = (latest[0], read_manifest(latest[1]).name) if latest else (0, None)
        if not self.model:
            self.log("evo: rl: no LLM operator in this run; --rl-every has nothing to train")
        elif latest is not None:  # a resumed run: its first proposals already come from the newest adapter
            self._switch(latest[1], self.current)

    def _emit(self, kind: str, **data: Any) -> None:
        if self.events is not None:
            self.events.emit(kind, None, **data)

    # -- after each batch of results (engine thread) ---------------------------------------------
    def step(self, evaluations: int) -> None:
        """Finish a round that ended; start one once the run has made ``evaluations`` >= the next mark."""
        if self._thread is not None and not self._thread.is_alive():
            self._thread = None
            self._finish(self._result or {"error": "the training thread ended without a result"})
        if self._thread is None and evaluations >= self.next_at and self.model:
            self.next_at = evaluations + self.every
            self._result = None
            self._thread = threading.Thread(target=self._round, args=(evaluations,), name="evo-rl", daemon=True)
            self._thread.start()

    def _switch(self, folder: Path, name: Optional[str]) -> None:
        try:
            switched = switch_adapter(self.operators, folder, name or folder.name)
        except Exception as exc:  # a broken adapter must not take the run down
            self._emit("rl_failed", stage="switch", error=f"{type(exc).__name__}: {exc}")
            self.log(f"evo: rl: could not switch to {folder}: {exc}")
            return
        self._emit("rl_switch", adapter=name, models=switched)

    def _finish(self, result: dict[str, Any]) -> None:
        if "error" in result:
            self._emit("rl_failed", stage="train", error=result["error"])
            self.log(f"evo: rl: update failed: {result['error'].splitlines()[0]}")
        elif "skip" in result:
            self._emit("rl_skip", reason=result["skip"], evaluations=result["evaluations"])
        else:
            m = result["manifest"]
            self.version, self.current = m.version, m.name
            self._switch(Path(result["folder"]), m.name)
            ranks = isinstance(self.config, RankConfig)  # ranking steps record a loss, GRPO steps a reward mean
            rewards = [] if ranks else [s["reward_mean"] for s in m.metrics]
            ranking = {"losses": [s["loss"] for s in m.metrics],
                       "ranking": dict(m.extra.get("ranking", {}))} if ranks else {}
            self._emit("rl_update", adapter=m.name, version=m.version, rows=m.dataset["rows"],
                       groups=m.dataset["groups"], evaluations=result["evaluations"], reward_means=rewards,
                       seconds=m.train_seconds, mode="rank" if ranks else "grpo", **ranking)
            self.log(f"evo: rl: adapter {m.name} from {m.dataset['rows']} rows, "
                     f"{len(m.metrics)} {'ranking' if ranks else 'GRPO'} steps in {m.train_seconds:.0f}s")

    def close(self, wait_s: float = 0.0) -> None:
        """At the end of the run: wait up to ``wait_s`` for a round in progress, then report it."""
        if self._thread is not None:
            self._thread.join(wait_s)
            if self._thread.is_alive():
                self._emit("rl_failed", stage="train", error="the run ended while an update was training")
                self.log("evo: rl: an update was still training at the end of the run; abandoned")
            else:
                self._thread = None
                self._finish(self._result or {"error": "no result"})

    # -- one training round (background thread) ------------------------------------------------
    def _round(self, evaluations: int) -> None:
        try:
            reader = Archive(self.archive, mode="r")
            try:
                self._train(reader, evaluations)
            finally:
                reader.close()
        except Exception:
            self._result = {"error": traceback.format_exc(limit=6)}

    def _train(self, reader: Archive, evaluations: int) -> None:
        ranking = isinstance(self.config, RankConfig)
        if ranking:  # every operator's measured pairs, the newest ``window`` of them
            rows = export_pairs([reader], templates=self.templates)[0][-self.window:]
            if not rank_groups(rows, self.templates)[0]:
                self._result = {"skip": "no parent with two measured children of different outcomes yet",
                                "evaluations": evaluations}
                return
        else:
            rows = export_rows([reader], last=self.window)
            table = RewardTable().add_archive(reader)
            if not any(r.get("template") and r.get("parent_knobs") is not None for r in rows):
                self._result = {"skip": "no LLM knob-edit rows in the archive yet", "evaluations": evaluations}
                return
        if self.policy is None:
            from ._adapters import backends_of, gate_of
            from ._policy import Policy

            init = self.store.folder(self.version) if self.version else None
            backend = backends_of(self.operators)[0][1]  # the first LLM operator's own model, on its device
            # on the timing GPU (the model co-located) every training step holds the lease
            self.policy = Policy(backend, seed=self.config.seed, init_adapter=init, gate=gate_of(self.operators))
        version = self.version + 1
        folder = self.store.folder(version)
        if ranking:
            manifest = train_rank_adapter(rows, folder, policy=self.policy, templates=self.templates, config=self.config,
                                          version=version, parent_adapter=self.current)[0]
            self._result = {"manifest": manifest, "folder": str(folder), "evaluations": evaluations}
            return
        manifest = train_adapter(rows, folder, policy=self.policy, templates=self.templates, table=table,
                                 config=self.config, version=version, parent_adapter=self.current,
                                 demos=[reader])
        self._result = {"manifest": manifest, "folder": str(folder), "evaluations": evaluations}
