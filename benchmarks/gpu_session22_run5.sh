#!/bin/bash
# Session 22 run 5 (one H200): the joined dot tiles (t on the left, one stage) at 2-4 rows
# against the heuristic's fma tiles of all rows, and the packed matmul's compile times with
# the new heuristic (compile_probe.py, ternary cases). Run from a copy of the tree (.s22/,
# ignored by git): cd .s22 && OUT=$OUT bash <this>.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
OUT=$OUT/compile timeout 120 python3 benchmarks/compile_probe.py --budget-s 100 \
  --only ternary_matmul,ternary_input_grad 2>&1 | grep -v Warn | cut -c1-170 > "$OUT/compile.log"
grep -E "ternary|over 5 s|error" "$OUT/compile.log" | head -40
timeout 200 python3 benchmarks/bench_ternary.py --part matmul --sweep interleave --batches 2,3,4 \
  --budget 170 --out "$OUT/rows" > "$OUT/rows.log" 2>&1
grep -v Warn "$OUT/rows.log" | sed 's/  */ /g' | cut -c1-170
