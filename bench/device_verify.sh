#!/usr/bin/env bash
# Second, short device call: re-run what the clock rule and the memoisation check changed
# (red-team cases, honest kernels not falsely flagged) and the ten largest grid shapes that the
# first call's seed benchmark did not reach. Writes $OUT/verify.log and $OUT/verify.tgz.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_verify; rm -rf "$W"; mkdir -p "$W"
log() { echo "=== $(date -u +%H:%M:%S) $*"; }
{
  git log -1 --format='commit %h %s' 2>/dev/null || true
  log "red team: the cases the last commits changed, plus neighbours, twice"
  timeout 90 python3 bench/redteam.py --rounds 2 --deadline-s 8 --every 4 \
    --only cache_content_hash_full,globaltimer_skip_when_hot,cache_content_hash,cache_output_fingerprint,zero_inputs_when_warm,oob_write_far,cache_in_workspace_ptrkey,noop_reused_output \
    --out "$W/redteam"
  log "honest template kernels under the memoisation check"
  timeout 80 python3 bench/eval_bench.py --n 12 --starts 2 --out "$W/eval"
  log "seed benchmark: the ten largest shapes"
  timeout 110 python3 bench/seed_bench.py --n 100 --picks 1 --largest --out "$W/seed"
  log "done"
} 2>&1 | tee "$W/verify.log"
cp "$W/verify.log" "$OUT/verify.log"
tar -czf "$OUT/verify.tgz" -C "$W" . 2>/dev/null || true
