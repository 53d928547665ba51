#!/usr/bin/env bash
# Session 4 on one H200: EGGROLL's benchmark and the ES step with device busy
# time (bench_low_rank.py), then the LM step at ranks 1 and 4 (bench_lm.py).
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
timeout 330 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4,8,16 --kinds binomial,rademacher \
  --only "inference|jaxnoise|eggroll|es step" --budget 280 --out "$R/bench" > "$R/bench.txt" 2>&1
grep -E "^(inference|jaxnoise|eggroll|es step)" "$R/bench.txt" | awk '{$1=$1};1' | cut -c1-200
timeout 120 python3 benchmarks/bench_lm.py --ranks 1,4 --pops 16384 --budget 80 --out "$R/lm" > "$R/lm.txt" 2>&1
grep -v '^{' "$R/lm.txt" | tail -4 | cut -c1-200
tar czf "$OUT/results_bench.tgz" -C "$R" .
