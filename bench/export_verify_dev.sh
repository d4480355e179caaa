#!/bin/bash
# Device check of issue 26's export plumbing (helper "export"): calibration (SM read and copy
# kernels, the memcpy in notes), a 20-s evo run on 3 shapes, evo export --verify on (top 3).
set -o pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 EVO_CALIBRATION_DIR=/tmp/evocal
A=/tmp/evo_export_dev
S="--shape 4096x18432x2304 --shape 64x128256x4096 --shape 1x4096x4096"
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__)"
t0=$(date +%s)
python3 -m evo run $A $S --budget 20s --operators knob --progress plain --seed 26 || echo "evo run exit $?"
t1=$(date +%s); echo "evo run: $((t1 - t0)) s"
cp $A/calibration.json $OUT/calibration.json
python3 -m evo export $A --out /tmp/evo_export_lib --verify on --verify-top 3 --json > $OUT/manifest.json
echo "export exit $?"; t2=$(date +%s); echo "export --verify: $((t2 - t1)) s"
python3 -c "
import json, sys
m = json.load(open(sys.argv[1]))
for s, p in sorted(m['paths'].items()):
    v = p.get('verify', {})
    print(s, p['path'], '|', p['why'][:220])
    for c in v.get('candidates', []):
        print('   rank', c['rank'], c['candidate'][:12], 'archive', c['archive_fitness'], 'retimed', c['speedup'], 'TN', c['speedup_same_layout'], c['status'])
" $OUT/manifest.json
python3 -m evo inspect $A --top 3 --width 200 | head -40
