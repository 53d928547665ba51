#!/bin/bash
# Session 22 run 6 (one H200): the packed matmul's joined dot tiles with several steps per
# program and the next step's loads carried in registers (MatmulConfig.register_prefetch)
# against the heuristic (one stage, no prefetch) at 8, 16 and 64 rows; the interleaved tests
# compiled first. Run from a copy of the tree (.s22/, ignored by git):
# cd .s22 && OUT=$OUT bash <this>.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 100 python3 -m pytest -q -x tests/test_ternary_ops.py -k "pallas and interleaved_dot" \
  > "$OUT/tests.log" 2>&1
tail -1 "$OUT/tests.log"
timeout 200 python3 benchmarks/bench_ternary.py --part matmul --sweep interleave --batches 8,16,64 \
  --budget 165 --out "$OUT/rows" > "$OUT/rows.log" 2>&1
grep -v Warn "$OUT/rows.log" | sed 's/  */ /g' | cut -c1-170
