#!/bin/bash
# Session 9 (one H200): the int4 decode selecting nibbles from the codes' buckets (compared in
# place on words) instead of unpacking each code: the decode kernels at the heuristic's
# tiling, the compiled matmul and decode checks, the packed matmul at 64 rows.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 120 python3 benchmarks/probe_decode_narrow.py --heuristic-only --out "$OUT" \
  > "$OUT/probe_decode.log" 2>&1
timeout 200 python3 benchmarks/bench_ternary.py --part check --only "matmul|decode" --budget 150 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 150 python3 benchmarks/bench_ternary.py --part matmul --batches 64 --budget 40 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -v Warn "$OUT/probe_decode.log"
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | tail -3
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-200 | head -8
