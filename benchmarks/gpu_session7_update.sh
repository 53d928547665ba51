#!/bin/bash
# Session 7 (one H200): the counter update in SPEC's rounding form (clip, then one float -> int
# conversion), compiled against the reference (check part, update and from_io cases), then
# timed in device time beside the session-6 kernels (a frozen copy, carried as
# .before/update_s6/), and from_io against XLA's GEMM + update in device time.
# Make the frozen copy with: git show c3aca90:jaxnoise/ops/ternary/reference.py and
# ..._update.py into .before/update_s6/, the update's `reference as ref_lib` import pointed at
# the sibling reference.py (RESULTS.md, session 7). Run 1's from_io baseline was still merged
# (see gpu_session7_from_io.sh).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 110 python3 benchmarks/bench_ternary.py --part check --only "counter_update|from_io" \
  --budget 80 --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 260 python3 benchmarks/bench_ternary.py --part update --budget 220 \
  --before-update .before/update_s6/pallas_triton_update.py --out "$OUT/update" \
  > "$OUT/update.log" 2>&1
timeout 170 python3 benchmarks/bench_ternary.py --part from_io --budget 120 \
  --out "$OUT/from_io" > "$OUT/from_io.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | head -20
sed 's/  */ /g' "$OUT/update.log" | cut -c1-230 | head -60
sed 's/  */ /g' "$OUT/from_io.log" | cut -c1-230 | head -30
