#!/bin/bash
# Session 15 (one GPU), run 2: the finiteness check's forms alone and inside the ES step
# (probe_finite_check.py, probe_es_step.py --finite-forms); the counter update with fewer
# instructions per weight compiled against main's frozen kernel bit for bit
# (benchmarks/baseline_update/), then timed beside it (bench_ternary.py --part update).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/finite" "$OUT/update"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 60 python3 benchmarks/probe_finite_check.py --out "$OUT/finite" 2>&1 | quiet
timeout 150 python3 benchmarks/probe_es_step.py --finite-forms --out "$OUT/finite" 2>&1 \
  | quiet | grep -v "^    " 
timeout 150 python3 benchmarks/baseline_update/check_counter_update.py \
  > "$OUT/update/check.log" 2>&1; echo "check exit $?"; quiet < "$OUT/update/check.log" | tail -25
timeout 100 python3 benchmarks/baseline_update/check_counter_update.py --suite thorough \
  > "$OUT/update/check_thorough.log" 2>&1; echo "thorough check exit $?"
quiet < "$OUT/update/check_thorough.log" | tail -4
timeout 200 python3 benchmarks/bench_ternary.py --part update \
  --before-update benchmarks/baseline_update/update_7fbab3d.py --out "$OUT/update" \
  > "$OUT/update/bench.log" 2>&1; echo "bench exit $?"
quiet < "$OUT/update/bench.log" | cut -c1-160 | tail -30
