#!/bin/bash
# Session 12 (one H200), run 1: a Mosaic GPU GEMM with the low-rank epilogue against XLA's GEMM
# and JAX's own Hopper GEMM (explore_mosaic_gemm.py); the ternary matmul tuners re-run after the
# session-11 fix that gives each timed call its own packed weights.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > "$OUT/gpu.txt"
python3 -c "import jax; print(jax.__version__)" >> "$OUT/gpu.txt"
cp "$(python3 -c 'import jax.experimental.pallas.ops.gpu.hopper_matmul_mgpu as m; print(m.__file__)')" \
  "$OUT/hopper_matmul_mgpu_jax.py.txt"
timeout 240 python3 benchmarks/explore_mosaic_gemm.py --out "$OUT" > "$OUT/mosaic.log" 2>&1
grep -v Warn "$OUT/mosaic.log" | grep -v _warn_once | cut -c1-400 | tail -40
timeout 200 python3 benchmarks/bench_ternary.py --part tune --only "input grad|ternary_matmul M=(4|256) " \
  --budget 170 --out "$OUT/tune" > "$OUT/tune.log" 2>&1
grep -v Warn "$OUT/tune.log" | grep -v _warn_once | cut -c1-200 | tail -40
