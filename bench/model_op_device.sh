#!/usr/bin/env bash
# One device call for issue 19's torch operator: seed and evaluate a few LLM-layer shapes
# (seed_bench, --picks 1), build the native operators (evo.torch, in parallel with the seeds),
# then bench/model_op_check.py (export, correctness eager / CUDA graph / torch.compile,
# host-inclusive time vs torch.matmul). Outputs: $OUT/log, $OUT/op_check.json, $OUT/seeds.tgz.
#
# Usage on the device, from the repository root: bash bench/model_op_device.sh
# Expected wall: ~40 s seeds (the build overlaps), ~20 s export, ~60 s checks; each step capped.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_model
rm -rf "$W"; mkdir -p "$W"
export EVO_TORCH_OPS_CACHE="$W/ops"
LOG="$OUT/log"
step() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
step "machine"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv; which c++ g++ nvcc
  python3 -c 'import torch, sys; print("torch", torch.__version__, "cuda", torch.version.cuda, "python", sys.version.split()[0])'
  python3 -c 'import transformers; print("transformers", transformers.__version__)' 2>&1 | tail -1; } 2>&1 | tee -a "$LOG"
step "build the native operators (background)"
python3 -c 'import time; t=time.time(); from evo.torch._ops import load_ops; print(load_ops(), f"{time.time()-t:.1f} s")' > "$W/build.log" 2>&1 &
BUILD=$!
printf 'M,N,K\n1,4096,4096\n8,4096,4096\n1,14336,4096\n1,576,576\n64,1536,576\n512,4096,4096\n' > "$W/shapes.csv"
step "seeds: seed_bench over 6 LLM-layer shapes"
timeout 90 python3 bench/seed_bench.py --grid "$W/shapes.csv" --n 6 --picks 1 --budget-s 40 \
  --archive "$W/seeds" --out "$W/seed" 2>&1 | tee -a "$LOG" | tail -12
step "wait for the build"
wait "$BUILD"; cat "$W/build.log" | tail -5 | tee -a "$LOG"
step "op check"
timeout 130 python3 bench/model_op_check.py --archive "$W/seeds" --out "$OUT" --work "$W/work" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
step "op check exit $rc"
tar -czf "$OUT/seeds.tgz" -C "$W" seeds seed 2>/dev/null
exit "$rc"
