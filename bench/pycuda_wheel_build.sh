#!/usr/bin/env bash
# Build pycuda from its sdist on the device (it ships no wheels; it needs cuda.h, a C++ compiler
# and Python's headers) and bring the wheel back under $OUT. Carry: .carry_pycuda (the sdist and
# its pure/cp312 dependency wheels, downloaded with pip on the CPU machine).
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
log() { echo "=== +$(( $(date +%s) - T0 ))s $*"; }
log "toolchain"
which g++ gcc c++ nvcc 2>&1 | head; ls /usr/local/cuda/include/cuda.h /usr/local/cuda/include/curand.h 2>&1
python3 -c "import sysconfig, os; p=sysconfig.get_paths()['include']; print(p, os.path.exists(p + '/Python.h'))"
python3 -c "import setuptools, wheel, numpy; print('setuptools', setuptools.__version__, 'wheel', wheel.__version__, 'numpy', numpy.__version__)" 2>&1 | tail -1
ls /usr/local/cuda/lib64/libcurand* /usr/local/cuda/lib64/stubs/libcuda* 2>&1 | head -4
mkdir -p /tmp/pyc/site "$OUT/wheels"
python3 -m pip install -q --no-index --no-deps --target /tmp/pyc/site .carry_pycuda/*.whl 2>&1 | tail -2  # setuptools and wheel too
log "build"
export CUDA_ROOT=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH PYTHONPATH=/tmp/pyc/site
timeout ${BUILD_S:-420} python3 -m pip wheel -v --no-deps --no-build-isolation --no-index -w "$OUT/wheels" \
  .carry_pycuda/pycuda-*.tar.gz > /tmp/pyc/build.log 2>&1; echo "build rc=$?"
tail -n 25 /tmp/pyc/build.log | cut -c1-300
cp /tmp/pyc/build.log "$OUT/" 2>/dev/null
ls -la "$OUT/wheels"
log "import"
python3 -m pip install -q --no-index --no-deps --target /tmp/pyc/site "$OUT"/wheels/pycuda-*.whl 2>&1 | tail -2
python3 -c "
import pycuda.driver as cuda
cuda.init(); d = cuda.Device(0); ctx = d.retain_primary_context(); ctx.push()
print('pycuda', __import__('pycuda').VERSION, d.name(), d.compute_capability())
ctx.pop()" 2>&1 | tail -3
log "done"
