#!/usr/bin/env bash
# One device call for issue 9: the export GPU tests, a seed archive over the 100-shape grid
# sample (seed_bench --archive), then the peers benchmark over that archive. Everything comes
# back as two files: $OUT/peers.tgz (peers/ outputs, seed_bench csv/json, run.log) and
# $OUT/seeds_archive.tgz (the archive, to re-export or re-run here).
#
# Usage on the device, repo root, with .carry_peers carried (the nvmath-python cp312 wheel):
#   bash bench/_peers_device.sh
# Knobs (env): TESTS=1 (0 skips the GPU tests), N=100 shapes, SEED_BUDGET_S=75 (seed_bench's
# submission budget), PEERS_MAX_S=200 (peers_bench --max-seconds). Expected wall with the
# defaults: ~30 s tests + ~100 s seeds + ~215 s peers, about 6 minutes; each step is capped by
# `timeout` (100 + 150 + PEERS_MAX_S + 120 s) so the whole stays under the 10-minute call limit. Exit status: peers_bench's (0 ok, 1 context
# lost or watchdog, 2 arguments), or 3 when the seed archive was not made.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_peers
rm -rf "$W"
mkdir -p "$W"
LOG="$W/run.log"
step() { echo "=== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }

step "machine"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  git log -1 --format='commit %h %s' 2>/dev/null || true; } 2>&1 | tee -a "$LOG"
step "install nvmath-python (no deps) into /tmp/site"
python3 -m pip install --no-deps --no-index --target /tmp/site -q .carry_peers/nvmath_python-1.0.0-*.whl 2>&1 | tee -a "$LOG"
python3 -c 'import nvmath, torch, triton; print("nvmath", nvmath.__version__, "torch", torch.__version__, "triton", triton.__version__)' 2>&1 | tee -a "$LOG"
if [ "${TESTS:-1}" = 1 ]; then
  step "GPU tests: exported library beside torch, cluster kernels"
  timeout 100 python3 -m pytest -q -m gpu tests/test_export_gpu.py -p no:cacheprovider 2>&1 | tee -a "$LOG" | tail -25
fi
step "seed archive: seed_bench --n ${N:-100} --picks 1 --budget-s ${SEED_BUDGET_S:-75}"
timeout 150 python3 bench/seed_bench.py --n "${N:-100}" --picks 1 --budget-s "${SEED_BUDGET_S:-75}" \
  --archive "$W/seeds" --out "$W/seed" 2>&1 | tee -a "$LOG" | tail -15
if [ ! -f "$W/seeds/archive.json" ]; then
  step "no seed archive: stopping"
  tar -czf "$OUT/peers.tgz" -C "$W" run.log
  exit 3
fi
step "peers: --max-seconds ${PEERS_MAX_S:-200}"
timeout $(( ${PEERS_MAX_S:-200} + 120 )) python3 bench/peers_bench.py --archive "$W/seeds" --from-archive \
  --out "$W/peers" --work "$W/work" --max-seconds "${PEERS_MAX_S:-200}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
step "peers_bench exit $rc"
tar -czf "$OUT/peers.tgz" -C "$W" peers run.log $(cd "$W" && ls seed/seed_bench.csv seed/seed_bench.json 2>/dev/null)
tar -czf "$OUT/seeds_archive.tgz" -C "$W" seeds
exit "$rc"
