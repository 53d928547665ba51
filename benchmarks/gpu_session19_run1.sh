#!/bin/bash
# Session 19 (one H200), run 1, on branch s19-split-completion (commit 37d8b5b; not on main):
# the packed matmul with the split along `in` finished in the
# kernel (the last program of an output tile sums the slabs in order, after a ticket: no XLA
# reduction after the kernel). Compiled tests (the split test repeats calls: races), compiled
# checks, then M = 1-16 at 4096^2 / 8192^2 against a dense bf16 matmul and the frozen kernels
# of d8ae541 (BEFORE, `git show d8ae541:jaxnoise/ops/ternary/pallas_triton_matmul.py`).
# cd .s19 && OUT=$OUT bash benchmarks/gpu_session19_run1.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
BEFORE=${BEFORE:-before_matmul.py}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 150 python3 -m pytest -q tests/test_ternary_ops.py -k "pallas and (matmul or fma or split)" \
  > "$OUT/tests.log" 2>&1
timeout 80 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 60 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 320 python3 benchmarks/bench_ternary.py --part matmul --batches 1,2,3,4,8,16 --budget 290 \
  --before-matmul "$BEFORE" --before-config heuristic --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
tail -3 "$OUT/tests.log"
echo "checks ok: $(grep -c 'ok True' "$OUT/check.log")"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -8
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-170 | head -150
