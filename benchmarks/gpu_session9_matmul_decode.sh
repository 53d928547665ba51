#!/bin/bash
# Session 9 (one H200): the packed matmul's "decode" method writing int4 nibbles or int8
# for XLA's GEMM (converted in its prologue) against the compute-dtype temporary, a dense
# bf16 matmul and GEMM tiles that decode in registers, at 64-1024 rows; the matmul cases
# of the compiled check first.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 150 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 120 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 400 python3 benchmarks/bench_ternary.py --part matmul --batches 64,256,1024 --budget 370 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -10
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-200 | head -90
