#!/bin/bash
# Session 16 (one GPU), run 2:
# 1. The gradient estimate with lane accumulators by default for 32-values-per-word kinds:
#    the kernel tests compiled, then bench_gradient_lanes.py (before / heuristic / neighbours,
#    each against the reference, lanes against rows bit for bit).
# 2. The counter update with fewer instructions, its packed fields kept live and the centres
#    derived again through an opaque copy (80 registers at 8192^2 in both dtypes offline):
#    compiled against main's frozen kernel bit for bit, then timed beside it.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/update"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_virtual_noise_kernels.py \
  -k "pallas and (bit_for_bit or flat_ops or linear_gradients)" > "$OUT/vn_tests.log" 2>&1
echo "vn tests exit $?"; tail -3 "$OUT/vn_tests.log"
timeout 150 python3 benchmarks/bench_gradient_lanes.py --budget 120 --out "$OUT" \
  > "$OUT/gradient_lanes.log" 2>&1; echo "lanes exit $?"
quiet < "$OUT/gradient_lanes.log" | grep -v '^{' | cut -c1-110 | tail -40
timeout 120 python3 benchmarks/baseline_update/check_counter_update.py \
  > "$OUT/update/check.log" 2>&1; echo "check exit $?"; quiet < "$OUT/update/check.log" | tail -3
timeout 170 python3 benchmarks/bench_ternary.py --part update \
  --before-update benchmarks/baseline_update/update_7fbab3d.py --budget 130 \
  --out "$OUT/update" > "$OUT/update/bench.log" 2>&1; echo "bench exit $?"
quiet < "$OUT/update/bench.log" | cut -c1-175 | grep -v '^{' | head -40
