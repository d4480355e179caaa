#!/usr/bin/env bash
# Session 4's device work for issue 4 (one H200): the evaluator's GPU busy share at tiny shapes
# and the repeatability of device medians across worker starts.
#   bash bench/device_s4.sh probe   GPU tests; 200 candidates at 64x128x64 (NVML, capture behind
#                                   the queued warm-up); a cProfile of 40 more; repeatability of
#                                   the sm90 seed at 4096^3 under three settle/rounds configs
#   bash bench/device_s4.sh tiny    GPU tests; 200 candidates at 64x128x64 as in a run; a cProfile of 60
#   bash bench/device_s4.sh pycuda  GPU tests; the evaluator through the pycuda loader (carry .carry_pycuda)
#   bash bench/device_s4.sh final   GPU tests; eval_bench 200 per shape + repeatability, a run's
#                                   settings and the precise preset side by side; the red-team
#                                   corpus twice with good kernels
# Writes under $OUT; nothing to carry.
set -u
PART=${1:?probe, tiny, pycuda or final}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
log() { echo "=== $(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*"; }
tiny_throughput() {  # 200 template candidates at 64x128x64 (throughput, NVML, phases)
  timeout 150 python3 bench/eval_bench.py --n 200 --shapes 64x128x64:TN --skip-repeatability \
    --out "$OUT/eb_tiny" > "$OUT/eb_tiny.log" 2>&1; echo "rc=$?"; tail -n 8 "$OUT/eb_tiny.log" | cut -c1-700
}
worker_profile() {  # N more at 64x128x64 under cProfile (EVO_WORKER_PROFILE), top functions to $OUT/profile.txt
  rm -rf /tmp/prof
  EVO_WORKER_PROFILE=/tmp/prof timeout "$2" python3 bench/eval_bench.py --n "$1" --shapes 64x128x64:TN \
    --skip-repeatability --out "$OUT/eb_prof" > "$OUT/eb_prof.log" 2>&1; echo "rc=$?"
  tail -n 5 "$OUT/eb_prof.log" | cut -c1-500
  python3 -c "
import glob, pstats
st = pstats.Stats(*sorted(glob.glob('/tmp/prof/*.prof')))
st.sort_stats('tottime').print_stats(40)
st.sort_stats('cumulative').print_stats(90)" > "$OUT/profile.txt" 2>&1
}
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw,power.limit,driver_version --format=csv
git log --oneline -1 2>/dev/null
log "evaluator GPU tests"
timeout 150 python3 -m pytest -m gpu -q tests/test_gpu_eval.py -p no:cacheprovider 2>&1 | tail -n 8
case "$PART" in
probe)
  log "eval_bench 200 at 64x128x64"
  tiny_throughput
  log "worker profile, 40 at 64x128x64"
  worker_profile 40 90
  head -n 60 "$OUT/profile.txt" | cut -c1-200
  log "repeatability configs at 4096^3"
  left=$(( 590 - ($(date +%s) - T0) ))
  timeout $left python3 bench/eval_bench.py --skip-throughput --shapes 4096x4096x4096:TN --starts 5 --rotations 3 \
    --rep-template sm90_wgmma --out "$OUT/eb_rep" \
    --rep-configs '{"default": {}, "soak1": {"settle_min_s": 1.0, "settle_s": 1.5}, "soak1_rounds160": {"settle_min_s": 1.0, "settle_s": 1.5, "rounds": 160}}' \
    > "$OUT/eb_rep.log" 2>&1; echo "rc=$?"; tail -n 14 "$OUT/eb_rep.log" | cut -c1-500
  ;;
tiny)
  log "eval_bench 200 at 64x128x64 (host timers for would-be elites, as in a run)"
  tiny_throughput
  log "worker profile, 60 at 64x128x64"
  worker_profile 60 100
  ;;
pycuda)  # carry .carry_pycuda (the wheel bench/device_pycuda_build.sh built, and its dependencies)
  mkdir -p /tmp/site
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .carry_pycuda/*.whl 2>&1 | tail -2
  export PYTHONPATH="/tmp/site:$PYTHONPATH"
  log "loader tests on the GPU (pycuda and driver)"
  timeout 240 python3 -m pytest -m gpu -q tests/test_loader_pycuda.py -p no:cacheprovider -s 2>&1 | grep -v "^$" | tail -n 16 | cut -c1-300
  log "eval_bench 60 at 64x128x64 (driver loader, after the launcher change)"
  timeout 90 python3 bench/eval_bench.py --n 60 --shapes 64x128x64:TN --skip-repeatability \
    --out "$OUT/eb_check" > "$OUT/eb_check.log" 2>&1; echo "rc=$?"; tail -n 6 "$OUT/eb_check.log" | cut -c1-500
  ;;
final)
  log "eval_bench 200 per shape + repeatability (defaults)"
  timeout ${EB_S:-360} python3 bench/eval_bench.py --n 200 --starts 5 --rotations 3 --rep-template sm90_wgmma \
    --rep-configs '{"run": {}, "precise": {"budget_s": 0.2, "max_rounds": 400}}' \
    --out "$OUT/eb" > "$OUT/eb.log" 2>&1; echo "eval_bench rc=$?"; tail -n 30 "$OUT/eb.log" | cut -c1-500
  log "red team: the corpus twice, good kernels interleaved (issue 5)"
  left=$(( 575 - ($(date +%s) - T0) ))
  timeout $left python3 bench/redteam.py --rounds 2 --deadline-s 8 --budget-s $(( left - 15 )) --every 10 \
    --out "$OUT/rt" > "$OUT/rt.log" 2>&1; echo "redteam rc=$?"; grep -v "^| " "$OUT/rt.log" | tail -n 12
  ;;
esac
log "done $PART"
