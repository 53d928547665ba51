#!/bin/bash
# Session 21 (one H200), run 1: counter_update_from_io with XLA's GEMM by row blocks
# (FromIOConfig.xla_gemm_rows): its compiled tests, session 20's compiled low-rank checks, then
# bench_ternary.py's from_io part (M = 4096, 1024, 256 on 4096x4096 bf16: GEMM + update,
# the heuristic, the kernels' GEMM, and row blocks of 1024 / 512 / 2048 / 256, with temp memory).
# cd .s21 && OUT=$OUT bash benchmarks/gpu_session21_run1.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import jax; print(jax.__version__, jax.devices())" >> "$OUT/gpu.txt" 2>&1
timeout 150 python3 -m pytest -q tests/test_ternary_ops.py tests/test_low_rank.py tests/test_optim_es.py \
  -k "gpu_counter_update or xla_gemm_row_blocks or first_row or weight_update_compiled_on_gpu or xla_gemm_estimate" \
  -p no:cacheprovider > "$OUT/tests.log" 2>&1; tail -3 "$OUT/tests.log"
timeout 200 python3 benchmarks/bench_ternary.py --part from_io --budget 150 --out "$OUT" 2>&1 | quiet \
  | tee "$OUT/from_io.log" | cut -c1-200
