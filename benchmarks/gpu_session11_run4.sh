#!/bin/bash
# Session 11 (one H200), run 4: the input-gradient tuner (tune_matmul_input_grad) at 1, 4 and
# 256 rows of 4096^2 in bfloat16 and float32, its pick timed against the heuristic in device
# time; the ternary kernel tests compiled (KERNEL_IMPLS includes "pallas" on a GPU).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 170 python3 benchmarks/bench_ternary.py --part tune --only "input grad" --budget 140 \
  --out "$OUT/tune" > "$OUT/tune.log" 2>&1
grep -v Warn "$OUT/tune.log" | grep -v _warn_once | cut -c1-200
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_ternary_ops.py \
  -k "pallas or gpu" > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log"
