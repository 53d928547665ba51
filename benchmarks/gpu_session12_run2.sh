#!/bin/bash
# Session 12 (one H200), run 2: explore_mosaic_gemm.py (run 1's call of it had a bug in its setup).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 300 python3 benchmarks/explore_mosaic_gemm.py --out "$OUT" > "$OUT/mosaic.log" 2>&1
grep -v Warn "$OUT/mosaic.log" | grep -v _warn_once | cut -c1-600 | tail -40
