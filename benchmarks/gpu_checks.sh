#!/usr/bin/env bash
# Compiled correctness on a GPU: the gpu-marked tests, every kernel test with
# implementation="pallas", and the compiled checks of bench_virtual_noise.py.
# Usage (device machine, repo root):  OUT=/some/dir bash benchmarks/gpu_checks.sh [quick]
set -u
export PYTHONPATH=. PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
OUT=${OUT:-benchmarks/out}
mkdir -p "$OUT"
python3 -m pytest -q -p no:cacheprovider -m gpu tests/ 2>&1 | tail -20 | tee "$OUT/pytest_gpu_marked.txt"
if [ "${1:-}" != "quick" ]; then
  timeout 420 python3 -m pytest -q -p no:cacheprovider -n 6 -k pallas \
    tests/test_virtual_noise_kernels.py tests/test_ternary_ops.py 2>&1 | tail -25 \
    | tee "$OUT/pytest_pallas.txt"
fi
timeout 300 python3 benchmarks/bench_virtual_noise.py --check --skip-noise-bits --skip-linear \
  --budget 240 --tag check_flat_tune_memory --out "$OUT" 2>&1 | tail -30
