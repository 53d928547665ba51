#!/bin/bash
# Session 15 (one GPU), run 1: the fused low-rank forward compiled against the reference (first
# run on an H100 if that is the card), one ES step of EGGROLL's layer through the transform
# before (before/: the package at 7fbab3d) and after (counted centred ranks, no barrier before
# the optimizer with xla_gemm=True), and EGGROLL's benchmark at ranks 1, 2, 4 with EGGROLL's
# code in the same run.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/es_before" "$OUT/es_after" "$OUT/bench"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest_fused.log" 2>&1
tail -3 "$OUT/pytest_fused.log"
probe() {  # $1: tree, $2: out folder
  (cd "$1" && PYTHONPATH=. timeout 100 python3 benchmarks/probe_es_step.py --skip-forms \
    --only "sgd (where|no check)$" --out "$2") 2>&1 | grep -v Warn | grep -v _warn_once | head -48
}
probe before "$OUT/es_before" > "$OUT/es_before.log"; cat "$OUT/es_before.log"
probe . "$OUT/es_after" > "$OUT/es_after.log"; cat "$OUT/es_after.log"
timeout 260 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --skip "materialized|step" --budget 230 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-150 | tail -30
