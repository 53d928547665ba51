#!/bin/bash
# Session 7 (one H200): the packed matmul's one-row fma tiles reading x in 16-byte vectors of
# consecutive lanes (split in registers) against session 6's strided lane loads, side by side
# (x_vector_loads=False), in device time; the matmul cases of the compiled check first.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONPATH=.
mkdir -p "$OUT"
timeout 100 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 70 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 250 python3 benchmarks/bench_ternary.py --part matmul --batches 1 --budget 200 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | head -10
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-200 | head -30
