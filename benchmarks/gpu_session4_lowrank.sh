#!/usr/bin/env bash
# Session 4 on one H200: the low-rank forward's variants side by side
# (explore_low_rank_gemm.py); with LM=1, the LM step at rank 4 and rank 1.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
timeout 300 python3 benchmarks/explore_low_rank_gemm.py --out "$R" > "$R/explore.txt" 2>&1
grep -E "^(bfloat16|float32)|error|check" "$R/explore.txt" | cut -c1-110 | head -60
if [ "${LM:-0}" = 1 ]; then
  timeout 150 python3 benchmarks/bench_lm.py --ranks 4,1 --pops 16384,65536 --budget 110 --out "$R/lm" > "$R/lm.txt" 2>&1
  grep -v '^{' "$R/lm.txt" | tail -10 | cut -c1-200
fi
tar czf "$OUT/results_lowrank.tgz" -C "$R" .
