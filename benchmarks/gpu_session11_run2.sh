#!/bin/bash
# Session 11 (one H200), run 2: the input gradient (grad_y @ W) at 1-1024 rows in bfloat16
# and float32 against a dense matmul of the same dtype and session 10's tiles (one program
# per 256 inputs over all of out; float32 as exact float32 dots). Then the forward with float32
# x at 4-16 rows: the fma tiles of all rows, decode and the dot tiles that split x in registers.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
for dtype in bfloat16 float32; do
  timeout 230 python3 benchmarks/bench_ternary.py --part matmul --op input_grad \
    --x-dtype $dtype --batches 1,4,16,64,256,1024 --before-config session10 --budget 190 \
    --out "$OUT/input_grad_$dtype" > "$OUT/input_grad_$dtype.log" 2>&1
  grep -v Warn "$OUT/input_grad_$dtype.log" | grep -v _warn_once | sed 's/  */ /g' \
    | cut -c1-170 | head -100
done
timeout 120 python3 benchmarks/bench_ternary.py --part matmul --x-dtype float32 --batches 4,8,16 \
  --budget 90 --out "$OUT/forward_f32_small" > "$OUT/forward_f32_small.log" 2>&1
grep -v Warn "$OUT/forward_f32_small.log" | grep -v _warn_once | sed 's/  */ /g' | cut -c1-170
