#!/bin/bash
# Session 18 (one H200), run 4: the final tree's ternary kernels compiled under pytest and the
# compiled checks; then the packed matmul at 1-4 rows with shallower pipelines and more
# programs (run 3's profile: the fma tiles of two rows wait on memory at 40% occupancy).
# cd .s18 && OUT=$OUT bash benchmarks/gpu_session18_run4.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 200 python3 -m pytest -q tests/test_ternary_ops.py -k "pallas or gpu" > "$OUT/tests.log" 2>&1
timeout 100 python3 benchmarks/bench_ternary.py --part check --only "matmul|decode" --budget 80 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 220 python3 benchmarks/bench_ternary.py --part matmul --batches 1,2,3,4 --budget 190 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
tail -3 "$OUT/tests.log"
echo "checks ok: $(grep -c 'ok True' "$OUT/check.log")"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -8
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-170 | head -80
