#!/bin/bash
# Prepared in session 16 for the next GPU session (one GPU): what session 16 could not measure.
# 1. XLA's int4 GEMM in pure JAX (check_int4_gemm.py) under the default flags and without
#    autotuning: does the reproducer fail as the library's int4 path did (run 4)?
# 2. The packed matmul's decode method with the bf16 temporary where int4 was the default:
#    forward and input gradient at 4-64 rows, bf16 and float32 x, against the dense matmul.
# 3. The counter update and its neighbours (8192^2 float32 / bfloat16, 1000x3996, 1536x2304)
#    against the frozen 7fbab3d kernel: does 4 warps for bfloat16 hold in a second run?
# 4. One ES step of EGGROLL's layer through evolution_strategy with the final code (counted
#    ranks, barrier kept), both dtypes: session 15 measured f32 only with the barrier removed.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/matmul" "$OUT/input_grad" "$OUT/update" "$OUT/es"
quiet() { grep -v Warn | grep -v _warn_once; }
for flags in "" "--xla_gpu_autotune_level=0"; do
  echo "== XLA_FLAGS=$flags"
  XLA_FLAGS="$flags" timeout 60 python3 benchmarks/check_int4_gemm.py --repeats 1 2>&1 \
    | quiet | cut -c1-160 | tail -7
done
for dtype in bfloat16 float32; do
  timeout 100 python3 benchmarks/bench_ternary.py --part matmul --batches 4,16,64 \
    --x-dtype $dtype --budget 80 --out "$OUT/matmul/$dtype" 2>&1 | quiet | grep -v '^{' | tail -8
  timeout 100 python3 benchmarks/bench_ternary.py --part matmul --op input_grad \
    --batches 2,4,16,64 --x-dtype $dtype --budget 80 --out "$OUT/input_grad/$dtype" 2>&1 \
    | quiet | grep -v '^{' | tail -8
done
timeout 200 python3 benchmarks/bench_ternary.py --part update \
  --before-update benchmarks/baseline_update/update_7fbab3d.py --budget 170 \
  --out "$OUT/update" 2>&1 | quiet | grep -v '^{' | cut -c1-175 | head -40
timeout 100 python3 benchmarks/probe_es_step.py --skip-forms --only "sgd (where|no check)$" \
  --out "$OUT/es" 2>&1 | quiet | grep "evolution_strategy"
