#!/bin/bash
# Session 6, run 6 (one H200): the packed matmul at M = 256 and 1024 (4096^2 and 8192^2) in
# device time: the decode-then-XLA-GEMM default against lane-ordered GEMM tiles that decode in
# registers, beside the dense bf16 matmul.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONPATH=.
mkdir -p "$OUT"
timeout 190 python3 benchmarks/bench_ternary.py --part matmul --batches 256,1024 --budget 150 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep "us" "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-200 | head -40
