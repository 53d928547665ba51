#!/usr/bin/env bash
# Issue 14 in one GPU run (about 5 minutes on one H200): compile time per kernel
# variant at offsets 0, 2**32+5, 2**40+3; reduce-metric layouts vs pure JAX;
# counter-update variants vs copy bandwidth (each screened against the reference).
# Writes JSON under $OUT (default benchmarks/out).
set -u
export OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-}:."
timeout 95 python3 benchmarks/compile_probe.py --budget-s 80 2>&1 | grep -v Warning | tee "$OUT/compile_probe.txt"
timeout 80 python3 benchmarks/bench_reduce_metric.py --kinds uniform 2>&1 | tee "$OUT/bench_reduce_metric.txt"
timeout 110 python3 benchmarks/bench_ternary.py --only "correctness,sweep update" --samples 10 \
  --inner 5 --out "$OUT" 2>&1 | grep -v '^CASE' | tee "$OUT/bench_ternary.txt"
