#!/bin/bash
# Session 12 (one H200), run 3: the fused Mosaic GPU low-rank forward. Compiled checks against
# the reference (every kind, offsets past 2**32, bias and antithetic on and off), then EGGROLL's
# benchmark (ranks 1-16, bf16 and f32) with the Triton path (fused_gemm=False) and EGGROLL's code
# side by side. Run from a copy of the tree; EGGROLL's noiser files in ../.peers.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/check" "$OUT/bench"
timeout 150 python3 benchmarks/bench_low_rank.py --check --only "fused check" --budget 130 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
grep -v Warn "$OUT/check.log" | grep -v _warn_once | cut -c1-330 | tail -16
timeout 330 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4,8,16 \
  --kinds binomial,rademacher --only "inference|jaxnoise|eggroll" --budget 300 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-200 | tail -60
