#!/usr/bin/env bash
# Session 3's first device call (single H200): diagnostics for issues 4 and 5 before changing code.
#   1. red team, one round with VA-reserved buffers (the placement fix b5fb000 on the GPU)
#   2. the worker under cProfile at 64x128x64 (where the tiny-shape time goes)
#   3. repeatability of the sm90_wgmma heuristic pick at 4096^3 (the seed the engine ships there)
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu,driver_version --format=csv
log "red team, vmm"
EVO_EVAL_BUFFERS=vmm timeout 200 python3 bench/redteam.py --rounds 1 \
  --repeat oob_write_far=2,pointer_alignment_cheat=2,pointer_hash_cheat=2 --deadline-s 8 --budget-s 150 \
  --every 10 --out "$OUT/rt" > /tmp/rt.log 2>&1; echo "redteam rc=$?"; tail -n 90 /tmp/rt.log
log "profile 64x128x64"
rm -rf /tmp/prof
EVO_WORKER_PROFILE=/tmp/prof timeout 150 python3 bench/eval_bench.py --n 36 --shapes 64x128x64:TN \
  --skip-repeatability --buffers vmm --out "$OUT/eb" > /tmp/eb.log 2>&1; echo "eval_bench rc=$?"; tail -n 6 /tmp/eb.log
python3 - <<'PY'
import glob, pstats
for f in glob.glob("/tmp/prof/*.prof"):
    st = pstats.Stats(f)
    st.sort_stats("cumulative").print_stats(45)
    st.sort_stats("tottime").print_stats(25)
PY
log "repeatability sm90_wgmma 4096^3"
timeout 150 python3 bench/eval_bench.py --n 1 --shapes 4096x4096x4096:TN --starts 5 --rotations 3 \
  --rep-template sm90_wgmma --buffers vmm --out "$OUT/rep" > /tmp/rep.log 2>&1; echo "rep rc=$?"; tail -n 4 /tmp/rep.log
log done
