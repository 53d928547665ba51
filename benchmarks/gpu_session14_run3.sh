#!/bin/bash
# Session 14 (one H200), run 3: the final defaults (fused GEMM at 4 stages, grid width 1) compiled
# against the reference (pytest), then EGGROLL's benchmark at ranks 1-16 (binomial) in bf16 and
# f32 with EGGROLL's code in the same run, and the plot.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/bench"
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest_fused.log" 2>&1
tail -3 "$OUT/pytest_fused.log"
timeout 330 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4,8,16 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --skip "materialized|step" --budget 300 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-150 | tail -40
