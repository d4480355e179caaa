"""RL updates of the LLM from the archives (issue 8): dataset export, GRPO with LoRA on peft,
versioned adapters with manifests, the learning check, and the split by model.

What callers use (``evo rl export`` / ``evo rl train`` / ``evo inspect``, ``evo run --rl-every N``,
the benchmarks) is named here; the private modules are this package's own. Importing it imports
no torch; the policy and trainer load torch, transformers and peft when they are used.

- data: :func:`export_rows`, :func:`export_pairs`, :func:`read_jsonl`/:func:`write_jsonl`,
  :class:`RewardConfig`/:class:`RewardTable`, :func:`read_layers`/:func:`split_by_model`;
- training: :class:`Policy`, :class:`LoraSettings`, :class:`GRPOConfig`, :func:`train_adapter`,
  :func:`prompts_from_rows`, :func:`add_elite_demos`, :class:`Prompt`, :class:`RewardSource`;
- the ranker (``evo rl rank``): :class:`RankConfig`, :func:`rank_groups`, :func:`split_groups`,
  :func:`train_ranker`, :func:`train_rank_adapter`, :func:`score_groups`, :func:`ranking_metrics` (:func:`pairwise_counts`);
- during a run: :class:`RLUpdater`, :func:`switch_adapter`, :func:`read_manifest` (an
  :class:`AdapterManifest`, the frozen record of a version's ``evo-adapter.json``),
  :func:`backends_of`, :class:`Measurer`, :func:`colocated_gate`;
- reading: :func:`adapter_stats`, :func:`check_figure`; the learning check's helpers.
"""
from ._adapters import backends_of, read_manifest, switch_adapter, table_from_rows, train_adapter
from ._manifest import AdapterManifest
from ._check import Target, choose_target, edit_text, edits, parent_of, proposal_share, synthetic_archive, transcript_of
from ._dataset import DatasetError, export_rows, group_advantages, messages_of, read_jsonl, write_jsonl
from ._grpo import GRPOConfig, Prompt, RewardSource, add_elite_demos, prompts_from_rows
from ._measure import Measurer, colocated_gate
from ._pairs import edit_completion, export_pairs
from ._plot import check_figure
from ._rank import RankConfig, RankGroup, pairwise_counts, rank_groups, ranking_metrics, score_groups, spearman, split_groups, train_rank_adapter, train_ranker
from ._policy import LoraSettings, Policy
from ._reward import RewardConfig, RewardTable, reward_of
from ._split import LayerRow, ShapeSplit, read_layers, split_by_model
from ._stats import adapter_stats
from ._updater import RLUpdater

__all__ = ["RewardConfig", "RewardTable", "reward_of", "DatasetError", "export_rows", "group_advantages",
           "messages_of", "read_jsonl", "write_jsonl", "export_pairs", "edit_completion", "edits", "parent_of",
           "proposal_share", "synthetic_archive", "transcript_of", "Target", "choose_target", "edit_text",
           "AdapterManifest", "backends_of", "read_manifest", "switch_adapter", "table_from_rows", "train_adapter", "GRPOConfig", "Prompt",
           "RewardSource", "add_elite_demos", "prompts_from_rows", "Measurer", "colocated_gate", "check_figure",
           "LoraSettings", "Policy", "LayerRow", "ShapeSplit", "read_layers", "split_by_model", "adapter_stats",
           "RLUpdater", "RankConfig", "RankGroup", "pairwise_counts", "rank_groups", "ranking_metrics", "score_groups", "spearman", "split_groups", "train_ranker",
           "train_rank_adapter"]
