#!/bin/bash
# Session 9 (one H200): the decode kernels' tilings (probe_decode_narrow.py), then the
# packed matmul's decode targets at 128 rows beside a dense bf16 matmul.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 240 python3 benchmarks/probe_decode_narrow.py --out "$OUT" > "$OUT/probe_decode.log" 2>&1
timeout 150 python3 benchmarks/bench_ternary.py --part matmul --batches 128 --budget 60 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -v Warn "$OUT/probe_decode.log" | cut -c1-160
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-200 | head -30
