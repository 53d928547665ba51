#!/bin/bash
# Session 7 (one H200): counter_update_from_io against XLA's GEMM + the fused update, every
# chained step on its own (x, grad_out) so XLA cannot form the baseline's GEMM once per group.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONPATH=.
mkdir -p "$OUT"
timeout 230 python3 benchmarks/bench_ternary.py --part from_io --budget 170 \
  --out "$OUT/from_io" > "$OUT/from_io.log" 2>&1
sed 's/  */ /g' "$OUT/from_io.log" | cut -c1-230 | head -30
