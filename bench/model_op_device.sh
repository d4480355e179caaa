#!/usr/bin/env bash
# One device call for issue 19's torch operator: seed and evaluate a few LLM-layer shapes
# (seed_bench, --picks 1), build the native operators (evo.torch, in parallel with the seeds),
# then bench/model_op_check.py (export, correctness eager / CUDA graph / torch.compile,
# host-inclusive time vs torch.matmul). Outputs: $OUT/log, $OUT/op_check.json, $OUT/seeds.tgz.
#
# Usage on the device, from the repository root: bash bench/model_op_device.sh
# Expected wall: ~40 s seeds (the build overlaps), ~20 s export, ~60 s checks; each step capped.
#
# GRID=1 (issue 19's wide check; carry .carry_shared with llm_layers.csv): the shapes are the
# 100-shape grid sample (seed_bench's, seed 3) plus the 48-row LLM-layer sample
# (bench/_llm_sample.py, as llm_layers_bench draws it), seeded within SEED_S (default 200) seconds,
# then the op check over every seeded shape within OPS_S (default 190) seconds. ~8-9 min in all.
# RESUME=DIR (with GRID=1; DIR holds an earlier call's seeds.tgz and op_check.json, carried): the
# earlier archive is restored first, so seed_bench seeds only the shapes it had not reached, and the
# op check skips the shapes timed before and joins their rows to its summary (--after).
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
if [ -n "${RESUME:-}" ]; then
  step "resume: restoring $RESUME/seeds.tgz"
  tar -xzf "$RESUME/seeds.tgz" -C "$W" || { step "cannot unpack $RESUME/seeds.tgz"; exit 3; }
fi
if [ "${GRID:-0}" = 1 ]; then
  python3 - "$W/shapes.csv" <<'PYEOF' 2>&1 | tee -a "$LOG"
import csv, sys
from pathlib import Path
sys.path.insert(0, "bench")
import seed_bench, _llm_sample as ls
grid = seed_bench.stratified(seed_bench.read_grid(None), 100, 3)
rows = []
for d in (Path(".carry_shared"), Path("../.carry_shared"), Path("../shared/shapes")):
    if (d / "llm_layers.csv").exists():
        rows = ls.sample(ls.candidate_pool(ls.read_rows(d / "llm_layers.csv")))
        break
shapes = sorted({(s.m, s.n, s.k) for s in grid} | {(r.m, r.n, r.k) for r in rows})
with open(sys.argv[1], "w", newline="") as fh:
    w = csv.writer(fh); w.writerow(["M", "N", "K"]); w.writerows(shapes)
print(f"shapes: {len(grid)} grid + {len(rows)} LLM-layer rows = {len(shapes)} distinct")
PYEOF
  N=$(( $(wc -l < "$W/shapes.csv") - 1 ))
  step "seeds: seed_bench over $N shapes (grid sample + LLM-layer sample), ${SEED_S:-200} s"
  timeout $(( ${SEED_S:-200} + 90 )) python3 bench/seed_bench.py --grid "$W/shapes.csv" --n "$N" --picks 1 \
    --order interleave --budget-s "${SEED_S:-200}" --compile-workers 12 --archive "$W/seeds" --out "$W/seed" 2>&1 \
    | tee -a "$LOG" | tail -12
  OPC=(--no-compile --reps 40 --max-seconds "${OPS_S:-190}")
  if [ -n "${RESUME:-}" ]; then OPC+=(--after "$RESUME/op_check.json"); fi
else
  printf 'M,N,K\n1,4096,4096\n8,4096,4096\n1,14336,4096\n1,576,576\n64,1536,576\n512,4096,4096\n' > "$W/shapes.csv"
  step "seeds: seed_bench over 6 LLM-layer shapes"
  timeout 90 python3 bench/seed_bench.py --grid "$W/shapes.csv" --n 6 --picks 1 --budget-s 40 \
    --archive "$W/seeds" --out "$W/seed" 2>&1 | tee -a "$LOG" | tail -12
  OPC=()
fi
step "wait for the build"
wait "$BUILD"; cat "$W/build.log" | tail -5 | tee -a "$LOG"
step "op check"
timeout $(( ${OPS_S:-100} + 150 )) python3 bench/model_op_check.py --archive "$W/seeds" --out "$OUT" --work "$W/work" \
  ${OPC[@]+"${OPC[@]}"} 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
step "op check exit $rc"
tar -czf "$OUT/seeds.tgz" -C "$W" seeds seed 2>/dev/null
exit "$rc"
