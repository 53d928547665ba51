#!/bin/bash
# Session 10 (one H200), run 2: the packed matmul with the fma tiles of several rows for
# M = 2 (the heuristic then; M = 3 joined it after this run) and in the sweep at M = 3-4. The compiled matmul checks, the matmul
# kernel tests compiled (pytest, KERNEL_IMPLS includes "pallas" on a GPU), then the
# sweep at M = 1-4 against a dense bf16 matmul and sessions 6-9's 16-row dot heuristic.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 120 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 90 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_ternary_ops.py \
  -k "several_rows or heuristic_configs_run or matmul_kernel_matches or matmul_vjp or gpu" \
  > "$OUT/pytest.log" 2>&1
timeout 260 python3 benchmarks/bench_ternary.py --part matmul --batches 1,2,3,4 --budget 220 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -10
tail -3 "$OUT/pytest.log"
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-170 | head -90
