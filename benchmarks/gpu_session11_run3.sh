#!/bin/bash
# Session 11 (one H200), run 3: the final heuristics. The compiled matmul checks (every
# heuristic's method, the input gradient's dot / decode, float32 pieces), then the boundaries
# the heuristics draw without a run-2 figure: the input gradient at 1-4 rows (bfloat16) and
# 1-16 rows (float32: decode from one row), the forward with float32 x at 2-4 rows.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 130 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 100 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -10
run() {  # name, then bench_ternary arguments
  local name=$1; shift
  timeout 110 python3 benchmarks/bench_ternary.py --part matmul "$@" --out "$OUT/$name" \
    > "$OUT/$name.log" 2>&1
  grep -v Warn "$OUT/$name.log" | grep -v _warn_once | sed 's/  */ /g' | cut -c1-150
}
run input_grad_bf16 --op input_grad --x-dtype bfloat16 --batches 1,2,3,4 --budget 80
run input_grad_f32 --op input_grad --x-dtype float32 --batches 1,2,4,16 --budget 80
run forward_f32 --x-dtype float32 --batches 2,3,4 --budget 60
