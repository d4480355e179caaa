#!/usr/bin/env bash
# Issue 9 on ONE H200 in two back-to-back calls (<= 560 s each): seeds over the 100-shape grid
# sample, `evo run` over all 100 shapes (resumed across the two calls), then the peers benchmark
# over the evolved archive with its three timers, the evolved-vs-seed columns and the plots.
#
#   call 1: bash bench/_grid_device.sh 1    (carry .whl .carry_peers)
#     GPU tests of the export (~30 s); seed_bench over the 100 shapes, interleaved over FLOP
#     decades with the largest first so all are reached, every seed recorded in
#     /tmp/evo_grid/seeds; a copy of that archive becomes the evolved archive /tmp/evo_grid/evo
#     (the seeds are its starting population: no second cold start) and `evo run` works on it
#     for the rest of the call.
#   call 2: bash bench/_grid_device.sh 2    (carry .whl .carry_peers, and .carry_grid: see below)
#     `evo run` resumed on the same archive, then peers_bench over the 100 shapes (export of the
#     best kernel per shape, torch.matmul NN/TN, cuBLASLt heuristic/autotuned, Triton; device,
#     offline and server timers; fresh-input check), with --seed-archive for evolved vs seed.
#
# /tmp survives between calls only while the machine stays warm. If call 2 finds no archive it
# restores .carry_grid/seeds.tgz and .carry_grid/evo_part1.tgz (call 1's outputs, copied there
# by the lead and carried). Each step is capped with `timeout`; the whole call stays under
# CALL_S (default 530) seconds. Knobs (env): CALL_S, TESTS=1 (0 skips the GPU tests), SEED_S=170
# (seed_bench's submission budget), PEERS_S=230 (peers_bench --max-seconds, export included),
# WORKERS=7 (compile workers: 16 cores shared with the other GPU's work), OPS=knob:3,optuna:1.
#
# Writes to $OUT: call 1 grid1.log, seeds.tgz (seed archive + seed_bench csv/json/png),
# evo_part1.tgz (the evolved archive after call 1); call 2 grid2.log, peers.tgz (peers.csv,
# summary.md/json, 3 plots), peers_summary.md, evo_archive.tgz (the final evolved archive).
# Exit status: call 1 0 (3 without an archive); call 2 peers_bench's (0 ok, 1 context lost or
# watchdog, 2 bad arguments), 3 without an archive.
set -u
PART=${1:?part 1 or 2}
T0=$(date +%s)
DEADLINE=$(( T0 + ${CALL_S:-530} ))
left() { echo $(( DEADLINE - $(date +%s) )); }
export PYTHONUNBUFFERED=1 PYTHONPATH="/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
W=/tmp/evo_grid
OUT=${OUT:-$W/out}
mkdir -p "$W" "$OUT" /tmp/site
LOG="$W/grid$PART.log"
: > "$LOG"
step() { echo "=== $(date -u +%H:%M:%S) [+$(( $(date +%s) - T0 ))s, $(left)s left] $*" | tee -a "$LOG"; }
WORKERS=${WORKERS:-7}
OPS=${OPS:-knob:3,optuna:1}

step "part $PART: machine"
{ nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,memory.used --format=csv
  git log -1 --format='commit %h %s' 2>/dev/null || true; echo "cores: $(nproc)"; } 2>&1 | tee -a "$LOG"
if ! python3 -c 'import optuna, nvmath' 2>/dev/null; then
  step "install optuna (.whl) and nvmath-python (.carry_peers) into /tmp/site, no deps"
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl .carry_peers/*.whl 2>&1 | tail -2 | tee -a "$LOG"
fi
python3 -c 'import optuna, nvmath, torch; print("optuna", optuna.__version__, "nvmath", nvmath.__version__, "torch", torch.__version__)' 2>&1 | tee -a "$LOG"
if ! python3 -c 'import optuna' 2>/dev/null; then OPS=knob; step "optuna missing: operators $OPS"; fi

# The 100 shapes (seed_bench's stratified sample, seed 3): a list, and evo run's config file.
shapes_file() {
  [ -f "$W/run.toml" ] && return 0
  python3 bench/seed_bench.py --list --n 100 > "$W/shapes.txt" || return 1
  { echo "shapes = ["; sed 's/.*/  "&",/' "$W/shapes.txt"; echo "]"; echo 'progress_interval = "60s"'; } > "$W/run.toml"
  echo "$(wc -l < "$W/shapes.txt") shapes -> $W/run.toml"
}

# evo run for the time left minus a reserve (what follows it in this call) and the drain.
evo_run() {
  local reserve=$1 budget rc
  budget=$(( $(left) - reserve - 40 ))
  if [ "$budget" -lt 30 ]; then step "evo run: only ${budget}s left for it, skipped"; return 0; fi
  step "evo run over $(wc -l < "$W/shapes.txt") shapes, ${budget}s, operators $OPS, $WORKERS compile workers"
  timeout -s TERM -k 30 $(( budget + 35 )) python3 -m evo run --config "$W/run.toml" --archive "$W/evo" \
    --budget "${budget}s" --operators "$OPS" --compile-workers "$WORKERS" --converge-window 12 \
    --converge-threshold 0.01 --progress plain > "$W/run$PART.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || tail -n 6 "$W/run$PART.log"
  grep -E '^evo: .*new best' "$W/run$PART.log" | tail -n 12
  grep -E '^evo run:' "$W/run$PART.log" | cut -c1-300
  grep -cE '^evo: .*new best' "$W/run$PART.log" | sed 's/^/new bests in this call: /'
  step "evo run exit $rc"
  cat "$W/run$PART.log" >> "$LOG"
}

rc=0
case "$PART" in
1)
  rm -rf "$W/seeds" "$W/seed" "$W/evo" "$W/peers" "$W/work" "$W/run.toml"
  if [ "${TESTS:-1}" = 1 ]; then
    step "GPU tests: exported libraries (cluster kernels; same-named code in two units)"
    timeout 75 python3 -m pytest -q -m gpu tests/test_export_gpu.py tests/test_export_link.py -p no:cacheprovider 2>&1 \
      | tail -n 8 | tee -a "$LOG"
  fi
  shapes_file | tee -a "$LOG"
  step "seeds: seed_bench --n 100 --picks 1 --order interleave --budget-s ${SEED_S:-170}"
  timeout -k 20 $(( ${SEED_S:-170} + 80 )) python3 bench/seed_bench.py --n 100 --picks 1 --order interleave \
    --budget-s "${SEED_S:-170}" --compile-workers "$WORKERS" --archive "$W/seeds" --out "$W/seed" > "$W/seed.log" 2>&1
  src=$?
  step "seed_bench exit $src after measuring $(grep -cE '^ *[0-9]+/[0-9]+ ' "$W/seed.log") shapes"
  [ "$src" = 0 ] || tail -n 6 "$W/seed.log"
  grep -E '^ *[0-9]+/[0-9]+ ' "$W/seed.log" | tail -n 5
  python3 -c 'import json, sys; s = json.load(open(sys.argv[1]))["summary"]; s.pop("ten_largest", None); print(json.dumps(s))' \
    "$W/seed/seed_bench.json" 2>&1 | cut -c1-2500
  cat "$W/seed.log" >> "$LOG"
  tar -czf "$OUT/seeds.tgz" -C "$W" $(cd "$W" && ls -d seeds seed 2>/dev/null)  # now: whatever happens next
  if [ -f "$W/seeds/archive.json" ]; then
    cp -a "$W/seeds" "$W/evo" && rm -f "$W/evo/.lock"
  else
    step "no seed archive: evo run seeds the shapes itself"
  fi
  evo_run 15
  tar -czf "$OUT/evo_part1.tgz" -C "$W" evo shapes.txt run.toml
  [ -f "$W/evo/archive.json" ] || rc=3
  ;;
2)
  if [ ! -f "$W/evo/archive.json" ]; then
    step "no archive in /tmp (the machine went cold): restoring call 1's from .carry_grid"
    for f in .carry_grid/seeds.tgz .carry_grid/evo_part1.tgz; do [ -f "$f" ] && tar -xzf "$f" -C "$W"; done
  fi
  if [ ! -f "$W/evo/archive.json" ]; then step "no evolved archive: stopping"; cp "$LOG" "$OUT/"; exit 3; fi
  shapes_file | tee -a "$LOG"
  PEERS_S=${PEERS_S:-230}
  evo_run $(( PEERS_S + 45 ))
  SEEDS=(); [ -f "$W/seeds/archive.json" ] && SEEDS=(--seed-archive "$W/seeds")
  [ $(( $(left) - 40 )) -lt "$PEERS_S" ] && PEERS_S=$(( $(left) - 40 ))  # the call's end comes first
  step "peers: --archive evo --from-archive --grid-sample 100 ${SEEDS[*]} --max-seconds $PEERS_S"
  rm -rf "$W/peers" "$W/work"
  timeout -k 15 $(( PEERS_S + 60 )) python3 bench/peers_bench.py --archive "$W/evo" --from-archive --grid-sample 100 \
    "${SEEDS[@]}" --out "$W/peers" --work "$W/work" --max-seconds "$PEERS_S" > "$W/peers.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || tail -n 6 "$W/peers.log"
  grep -E '^ *[0-9]+/[0-9]+ ' "$W/peers.log" | tail -n 6
  sed -n '/^# evo vs peers/,/^## device timer/p' "$W/peers.log"
  step "peers_bench exit $rc"
  cat "$W/peers.log" >> "$LOG"
  tar -czf "$OUT/peers.tgz" -C "$W" peers
  cp "$W/peers/summary.md" "$OUT/peers_summary.md" 2>/dev/null
  tar -czf "$OUT/evo_archive.tgz" -C "$W" evo
  ;;
*) echo "part 1 or 2" >&2; exit 2 ;;
esac
step "done part $PART"
cp "$LOG" "$OUT/"
exit "$rc"
