#!/bin/bash
# Session 10 (one H200), the final code: the compiled matmul checks (the 2- and 3-row
# heuristics included) and test_ternary_ops.py's compiled tests ("pallas" in KERNEL_IMPLS
# on a GPU, and the gpu-marked ones).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 120 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 90 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 330 python3 -m pytest -q -p no:cacheprovider tests/test_ternary_ops.py \
  -k "pallas or gpu" > "$OUT/pytest.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -10
tail -5 "$OUT/pytest.log"
