#!/bin/bash
# Session 22 run 7 (one H200): the final tree's ternary tests compiled (the packed matmul with
# the joined tiles by default from 5 to 64 rows, register_prefetch, the GPU-only tests).
# Run from a copy of the tree (.s22/, ignored by git): cd .s22 && OUT=$OUT bash <this>.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 250 python3 -m pytest -q tests/test_ternary_ops.py tests/test_ternary_nn_optim.py -k "pallas or gpu" \
  > "$OUT/tests.log" 2>&1
tail -4 "$OUT/tests.log"
