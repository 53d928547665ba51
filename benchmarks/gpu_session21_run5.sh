#!/bin/bash
# Session 21 (one H200), run 5: the dense counter update after this session's change to its
# kernel (the optional row block) beside a frozen copy of ce8f873's module, as a fraction of
# copy bandwidth (bench_ternary.py --part update --before-update); then the from_io part through
# the public config with the final code.
# Needs before/update_ce8f873.py: git show ce8f873:jaxnoise/ops/ternary/pallas_triton_update.py
# cd .s21 && OUT=$OUT bash benchmarks/gpu_session21_run5.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 170 python3 benchmarks/bench_ternary.py --part update --budget 120 \
  --before-update before/update_ce8f873.py --out "$OUT" 2>&1 | quiet | tee "$OUT/update.log" | cut -c1-220
timeout 130 python3 benchmarks/bench_ternary.py --part from_io --budget 90 --out "$OUT" 2>&1 | quiet \
  | tee "$OUT/from_io.log" | cut -c1-200
