#!/bin/bash
# Session 8 (one H200): the ES step after centered_rank's rewrite (one sort, two scans, one
# scatter instead of two searchsorted while loops): probe_es_step.py kernel by kernel, then
# bench_low_rank.py's ES-step cases (ranks 1 and 4, SGD and Adam, three gradient forms).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 120 python3 benchmarks/probe_es_step.py --out "$OUT" > "$OUT/probe_es_step.log" 2>&1
grep -v Warn "$OUT/probe_es_step.log"
timeout 330 python3 benchmarks/bench_low_rank.py --bench --ranks 1 --kinds binomial \
  --only "inference|es step" --budget 290 --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | cut -c1-200 | tail -40
