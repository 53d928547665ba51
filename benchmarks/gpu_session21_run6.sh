#!/bin/bash
# Session 21 (one H200), run 6: warps per program of the dense counter update by gradient dtype
# (probe_update_warps.py: bfloat16 at six shapes, heuristic / half / twice its warps; float32
# heuristic / half at three).
# cd .s21 && OUT=$OUT bash benchmarks/gpu_session21_run6.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 260 python3 benchmarks/probe_update_warps.py --out "$OUT" 2>&1 | quiet | tee "$OUT/probe.log"
