"""RL updates of the LLM from the archives (issue 8): dataset export, GRPO with LoRA on peft,
versioned adapters with manifests, and the learning check.

``evo rl export`` / ``evo rl train`` (evo._cmd_rl) and ``evo run --rl-every N`` use this package.
Importing it imports no torch; the policy and trainer load torch, transformers and peft.
"""
from ._check import Target, choose_target, edit_text, edits, parent_of, proposal_share, synthetic_archive, transcript_of
from ._dataset import DatasetError, export_rows, group_advantages, messages_of, read_jsonl, write_jsonl
from ._pairs import edit_completion, export_pairs
from ._reward import RewardConfig, RewardTable, reward_of

__all__ = ["RewardConfig", "RewardTable", "reward_of", "DatasetError", "export_rows", "group_advantages",
           "messages_of", "read_jsonl", "write_jsonl", "export_pairs", "edit_completion", "edits", "parent_of", "proposal_share", "synthetic_archive",
           "transcript_of", "Target", "choose_target", "edit_text"]
