#!/bin/bash
# Session 18 (one H200): the packed matmul's multiply-add tiles with t from two clamped adds
# per code (add.rn.sat.f32; one integer op per in-place code instead of five) and one fma
# per product. Compiled checks and tests, then M = 1-16 at 4096^2 / 8192^2 against a dense
# bf16 matmul and the frozen kernels of 196a4a8 (BEFORE, default before_matmul.py, copied
# with `git show 196a4a8:jaxnoise/ops/ternary/pallas_triton_matmul.py`) at the heuristic.
# Run from a copy of the tree (.s18/, ignored by git): cd .s18 && OUT=$OUT bash <this>.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
BEFORE=${BEFORE:-before_matmul.py}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 100 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 80 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 150 python3 -m pytest -q -x tests/test_ternary_ops.py -k "pallas and (matmul or fma)" \
  > "$OUT/tests.log" 2>&1
timeout 320 python3 benchmarks/bench_ternary.py --part matmul --batches 1,2,3,4,8,16 --budget 290 \
  --before-matmul "$BEFORE" --before-config heuristic --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
echo "checks ok: $(grep -c 'ok True' "$OUT/check.log")"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -8
tail -3 "$OUT/tests.log"
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-160 | head -150
