#!/usr/bin/env bash
# Session 3's device work when only ONE H200 is lent: three calls back to back (the machine
# stays warm 30 s between calls; /tmp keeps its files while it does).
#   bash bench/device_s3_1gpu.sh eval   evaluator GPU tests, eval_bench 200 per shape + repeatability
#                                       (issue 4), the red-team corpus twice with good kernels (issue 5)
#   bash bench/device_s3_1gpu.sh grid   seeds over the 100-shape sample, a short evo run over them,
#                                       peers benchmark over the evolved archive (issue 9)
#   bash bench/device_s3_1gpu.sh rl     the RL learning check with the evaluator in the loop (issue 8)
# Carry: eval .carry1; grid .whl .carry_peers; rl .carry2 (the llm wheel split in two).
set -u
PART=${1:?eval, grid or rl}
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p /tmp/w /tmp/site /tmp/logs
T0=$(date +%s)
log() { echo "=== $(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*"; }
pipi() { python3 -m pip install -q --no-index --no-deps --target /tmp/site "$@" 2>&1 | tail -2; }
case "$PART" in
eval)
  nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw,driver_version --format=csv
  cp .carry1/* /tmp/w/ 2>/dev/null
  log "evaluator GPU tests"
  timeout 120 python3 -m pytest -m gpu -q tests/test_gpu_eval.py -p no:cacheprovider 2>&1 | tail -n 12
  log "eval_bench 200 per shape + repeatability (issue 4)"
  timeout ${EB_S:-330} python3 bench/eval_bench.py --n 200 --starts 5 --rotations 3 --rep-template sm90_wgmma \
    --out "$OUT/eb" > "$OUT/eb.log" 2>&1; echo "eval_bench rc=$?"; tail -n 40 "$OUT/eb.log" | cut -c1-400
  log "red team: the corpus twice, good kernels interleaved (issue 5)"
  left=$(( 575 - ($(date +%s) - T0) ))
  timeout $left python3 bench/redteam.py --rounds 2 --deadline-s 8 --budget-s $(( left - 15 )) --every 10 \
    --out "$OUT/rt" > /tmp/logs/rt.log 2>&1; echo "redteam rc=$?"; grep -v "^| " /tmp/logs/rt.log | tail -n 12
  ;;
grid)
  pipi .whl/*.whl .carry_peers/*.whl
  CALL_S=${G1_S:-290} SEED_S=${SEED_S:-125} WORKERS=12 bash bench/_grid_device.sh 1 > /tmp/logs/g1.log 2>&1
  echo "grid 1 rc=$?"; tail -n 25 /tmp/logs/g1.log | cut -c1-300
  CALL_S=${G2_S:-275} PEERS_S=${PEERS_S:-205} WORKERS=12 bash bench/_grid_device.sh 2 > /tmp/logs/g2.log 2>&1
  echo "grid 2 rc=$?"; tail -n 45 /tmp/logs/g2.log | cut -c1-300
  ;;
rl)
  cat /tmp/w/llm.part00 .carry2/llm.part01 > /tmp/w/llm.tar && mkdir -p /tmp/w/llm && tar -xf /tmp/w/llm.tar -C /tmp/w/llm
  pipi /tmp/w/llm/*.whl
  rm -rf /tmp/rl8
  log "RL learning check with the evaluator in the loop (issue 8)"
  timeout ${RL_S:-560} python3 bench/rl_learning_check.py --evaluator gpu --gpus 0 --out /tmp/rl8 \
    --max-minutes ${RL_MIN:-9}; echo "rl rc=$?"
  tar -czf "$OUT/rl8.tgz" -C /tmp rl8/result.json rl8/learning_check.svg $(cd /tmp && ls -d rl8/adapters/*/evo-adapter.json 2>/dev/null) 2>/dev/null
  ;;
esac
log "done $PART"
