#!/bin/bash
# Session 7 (one H200): the ternary autotuners (jaxnoise.ops.ternary.tuning, correctness screen
# included) at the benchmark shapes, then the heuristic and the selected config side by side in
# device time (bench_ternary.py --part tune).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONPATH=.
mkdir -p "$OUT"
timeout 540 python3 benchmarks/bench_ternary.py --part tune --budget 480 --out "$OUT/tune" \
  ${ONLY:+--only "$ONLY"} > "$OUT/tune.log" 2>&1
sed 's/  */ /g' "$OUT/tune.log" | cut -c1-400 | head -40
# Second call, after the from_io screen's scale step was tied to the gradient's size:
#   OUT=$OUT ONLY=from_io bash benchmarks/gpu_session7_tune.sh
