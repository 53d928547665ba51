#!/bin/bash
# Session 15 (one GPU), run 5: the counter update with fewer instructions, its centres now
# re-read from the packed fields for the tick (74 registers at 8192^2 float32 and 75 in bf16 in
# XLA's offline compile, against 95 and 94 in runs 2-4): compiled against main's frozen kernel
# bit for bit, then timed beside it.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/update"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 150 python3 benchmarks/baseline_update/check_counter_update.py \
  > "$OUT/update/check.log" 2>&1; echo "check exit $?"; quiet < "$OUT/update/check.log" | tail -3
timeout 200 python3 benchmarks/bench_ternary.py --part update \
  --before-update benchmarks/baseline_update/update_7fbab3d.py --budget 150 \
  --out "$OUT/update" > "$OUT/update/bench.log" 2>&1; echo "bench exit $?"
quiet < "$OUT/update/bench.log" | cut -c1-175 | head -30
timeout 90 python3 benchmarks/baseline_update/check_counter_update.py --suite thorough \
  --no-reference > "$OUT/update/check_thorough.log" 2>&1; echo "thorough check exit $?"
quiet < "$OUT/update/check_thorough.log" | tail -2
