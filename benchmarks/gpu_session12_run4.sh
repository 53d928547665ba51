#!/bin/bash
# Session 12 (one H200), run 4: the fused Mosaic GPU forward for one-row members in antithetic
# pairs (noise hashed once per pair, popc, per-pair operands from one Triton kernel). Compiled
# checks, then EGGROLL's benchmark in bf16 against the Triton path, the SWAR popcount variant and
# EGGROLL's code. Run from a copy of the tree; EGGROLL's noiser files in ../.peers.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/check" "$OUT/bench"
timeout 150 python3 benchmarks/bench_low_rank.py --check --only "fused check" --budget 110 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
grep -v Warn "$OUT/check.log" | grep -v _warn_once | cut -c1-250 | tail -16
timeout 300 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4,8,16 \
  --kinds binomial,rademacher --only "inference bfloat16|jaxnoise bfloat16|eggroll bfloat16" \
  --budget 270 --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-140 | tail -45
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log"
