#!/usr/bin/env bash
# One device call that gathers the figures of issues 3-6 on the H200 (the session's device time
# is short, so everything that needs the GPU runs here, in priority order, each step capped).
# Usage on the device: bash bench/device_final.sh   (writes $OUT/summary.log and $OUT/results.tgz)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_final; rm -rf "$W"; mkdir -p "$W"
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
{
  log "machine"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv
  git log -1 --format='commit %h %s' 2>/dev/null || true
  log "red team (issue 5)"
  timeout "${T_REDTEAM:-230}" python3 bench/redteam.py --rounds 2 --deadline-s 8 --budget-s 190 --out "$W/redteam"
  log "evaluator throughput + repeatability (issue 4)"
  timeout "${T_EVAL:-110}" python3 bench/eval_bench.py --n 16 --starts 5 --out "$W/eval"
  log "GPU tests"
  timeout "${T_TESTS:-70}" python3 -m pytest -q -m gpu tests/test_gpu_eval.py -p no:cacheprovider
  log "evo seed + evo run end to end (issue 6)"
  timeout "${T_RUN:-70}" bash -c "python3 -m evo seed --shape 1024x1024x1024 --shape 64x64x4096 --archive $W/arch --per-template 3 \
    && python3 -m evo run --shape 1024x1024x1024 --shape 64x64x4096 --archive $W/arch --budget 45s --operators knob --progress plain \
    && python3 -m evo inspect $W/arch --top 5"
  log "seed benchmark over the grid sample (issue 3)"
  timeout "${T_SEED:-100}" python3 bench/seed_bench.py --n 100 --picks 1 --budget-s 60 --out "$W/seed"
  log "done"
} 2>&1 | tee "$W/summary.log"
cp "$W/summary.log" "$OUT/summary.log"
for f in redteam/redteam.md eval/eval_bench.json seed/seed_bench.png seed/seed_bench.json; do
  [ -f "$W/$f" ] && cp "$W/$f" "$OUT/$(basename "$f")"
done
tar -czf "$OUT/results.tgz" -C "$W" --exclude='*.evolog' . 2>/dev/null || true
