#!/bin/bash
# Session 22 run 4 (one H200): the packed matmul's new heuristic from 5 to 64 rows of 16-bit x
# (dot tiles with t joined on the left, one pipeline stage) against sessions 6-21's per-lane
# dot tiles, decode-then-GEMM and a dense bf16 matmul; compiled tests and checks first.
# Run from a copy of the tree (.s22/, ignored by git): cd .s22 && OUT=$OUT bash <this>.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 200 python3 -m pytest -q tests/test_ternary_ops.py \
  -k "pallas and (matmul or interleaved or heuristic or fma or split)" > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
timeout 100 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 80 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
echo "checks ok: $(grep -c 'ok True' "$OUT/check.log")"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -8
timeout 230 python3 benchmarks/bench_ternary.py --part matmul --sweep interleave \
  --batches 5,8,12,16,24,32,48,64 --budget 200 --out "$OUT/rows" > "$OUT/rows.log" 2>&1
grep -v Warn "$OUT/rows.log" | sed 's/  */ /g' | cut -c1-170
