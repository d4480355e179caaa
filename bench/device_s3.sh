#!/usr/bin/env bash
# Session 3's integrated device work on a 2-GPU H200 host, two calls made back to back (the
# machine stays warm for 30 s between calls; /tmp keeps its files while it does). One job per GPU
# (CUDA_VISIBLE_DEVICES), so the two never time on the same card; 32 cores, 16 per job.
#
#   call 1: bash bench/device_s3.sh 1   (carry .whl .carry_peers .carry1)
#       GPU0: evaluator GPU tests, eval_bench 200 candidates per shape + repeatability (issue 4),
#             then the red-team corpus twice, interleaved with good kernels (issue 5)
#       GPU1: bench/_grid_device.sh 1: seeds over the 100-shape sample, evo run over them (issue 9)
#   call 2: bash bench/device_s3.sh 2   (carry .whl .carry_peers .carry2)
#       GPU0: the RL learning check with the evaluator in the loop (issue 8)
#       GPU1: bench/_grid_device.sh 2: evo run resumed, then the peers benchmark (issue 9)
set -u
PART=${1:?part 1 or 2}
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p /tmp/w /tmp/site /tmp/logs
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
pipi() { python3 -m pip install -q --no-index --no-deps --target /tmp/site "$@" 2>&1 | tail -2; }
case "$PART" in
1)
  log "machine"; nvidia-smi --query-gpu=index,name,clocks.sm,temperature.gpu,driver_version --format=csv; nproc
  cp .carry1/* /tmp/w/ 2>/dev/null
  pipi .whl/*.whl .carry_peers/*.whl
  ( export CUDA_VISIBLE_DEVICES=1 OUT="$OUT/grid"; mkdir -p "$OUT/grid"
    CALL_S=${GRID1_S:-540} WORKERS=14 bash bench/_grid_device.sh 1; echo "grid part 1 rc=$?" ) > /tmp/logs/grid1.log 2>&1 &
  GPU1=$!
  ( export CUDA_VISIBLE_DEVICES=0
    log "GPU0: evaluator GPU tests"
    timeout 120 python3 -m pytest -q -m gpu tests/test_gpu_eval.py -p no:cacheprovider 2>&1 | tail -n 6
    log "GPU0: eval_bench 200 per shape (issue 4)"
    timeout ${EB_S:-300} python3 bench/eval_bench.py --n 200 --starts 5 --rotations 3 --rep-template sm90_wgmma \
      --compile-workers 14 --out /tmp/eb; echo "eval_bench rc=$?"
    log "GPU0: red team, corpus twice (issue 5)"
    timeout ${RT_S:-200} python3 bench/redteam.py --rounds 2 --deadline-s 8 --budget-s 180 --every 10 --out /tmp/rt \
      > /tmp/logs/rt.log 2>&1; echo "redteam rc=$?"; tail -n 12 /tmp/logs/rt.log ) > /tmp/logs/gpu0a.log 2>&1 &
  GPU0=$!
  wait $GPU0; wait $GPU1
  tail -n 60 /tmp/logs/gpu0a.log | cut -c1-400; tail -n 40 /tmp/logs/grid1.log | cut -c1-300
  cp /tmp/logs/gpu0a.log /tmp/logs/grid1.log "$OUT/"
  tar -czf "$OUT/eval_rt.tgz" -C /tmp eb rt 2>/dev/null
  ;;
2)
  cat /tmp/w/llm.part00 .carry2/llm.part01 > /tmp/w/llm.tar && mkdir -p /tmp/w/llm && tar -xf /tmp/w/llm.tar -C /tmp/w/llm
  pipi /tmp/w/llm/*.whl
  python3 -c "import optuna, nvmath" 2>/dev/null || pipi .whl/*.whl .carry_peers/*.whl
  ( export CUDA_VISIBLE_DEVICES=1 OUT="$OUT/grid"; mkdir -p "$OUT/grid"
    CALL_S=${GRID2_S:-540} WORKERS=14 bash bench/_grid_device.sh 2; echo "grid part 2 rc=$?" ) > /tmp/logs/grid2.log 2>&1 &
  GPU1=$!
  ( export CUDA_VISIBLE_DEVICES=0
    log "GPU0: RL learning check with the evaluator in the loop (issue 8)"
    rm -rf /tmp/rl8
    timeout ${RL_S:-540} python3 bench/rl_learning_check.py --evaluator gpu --gpus 0 --out /tmp/rl8 \
      --max-minutes ${RL_MIN:-8.5}; echo "rl rc=$?" ) > /tmp/logs/rl.log 2>&1 &
  GPU0=$!
  wait $GPU0; wait $GPU1
  tail -n 50 /tmp/logs/rl.log | cut -c1-300; tail -n 50 /tmp/logs/grid2.log | cut -c1-300
  cp /tmp/logs/rl.log /tmp/logs/grid2.log "$OUT/"
  tar -czf "$OUT/rl8.tgz" -C /tmp rl8/result.json rl8/learning_check.svg $(cd /tmp && ls -d rl8/adapters/*/evo-adapter.json 2>/dev/null) 2>/dev/null
  ;;
esac
log "done part $PART"
