"""LLM proposal operators (issue 7): prompts from data files, forgiving and strict parsing,
backends behind one ``complete()`` interface (local transformers with grammar-constrained knob
edits, an OpenAI-compatible HTTP client, in-process vLLM), models configured as data with a
bandit choosing among several, and :class:`LLMOperator`.

Importing this package does not import torch, transformers or vllm; a backend loads them (and
the model) on the first proposal.
"""
from ._base import Completion, LLMBackend
from ._bandit import ModelBandit
from ._claims import BatchClaims
from ._grammar import PREFIX, KnobEditGrammar
from ._hooks import DecodeHook
from ._model_cache import load_gguf
from ._checks import check_device, check_spec, check_url, probe_server
from ._models import (BACKENDS, LLM_BACKENDS, MODELS_FILE, SPEC_STRINGS, ModelSpec, get_backend, load_models,
                      resolve_model, spec_string)
from ._operator import LLMOperator
from ._parse import Parsed, apply_edits, code_blocks, parse_edits, parse_knob_edit, parse_source
from ._prompts import KINDS, MODES, PROMPTS_DIR, load_prompts, render_messages
from ._scorer import UNSCORED, LLMScorer, scored_edit
from ._transformers import DEFAULT_MODEL, TransformersBackend, load_backend

__all__ = ["LLMBackend", "LLMOperator", "BatchClaims", "KnobEditGrammar", "PREFIX", "Parsed", "apply_edits", "code_blocks", "parse_edits",
           "parse_knob_edit", "parse_source", "KINDS", "MODES", "PROMPTS_DIR", "load_prompts", "render_messages",
           "DEFAULT_MODEL", "Completion", "TransformersBackend", "load_backend", "ModelBandit", "BACKENDS",
           "LLM_BACKENDS", "SPEC_STRINGS", "spec_string",
           "MODELS_FILE", "ModelSpec", "get_backend", "load_gguf", "load_models", "resolve_model", "LLMScorer", "scored_edit",
           "UNSCORED", "check_device", "check_spec", "check_url", "probe_server", "DecodeHook"]
