#!/bin/bash
# Session 9 (one H200), the merged code: the compiled matmul checks, the packed matmul at 64
# rows (int4 temporary, the heuristic, against the bf16 one and a dense matmul), and the
# suite's GPU-only tests.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 150 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 120 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 150 python3 benchmarks/bench_ternary.py --part matmul --batches 64 --budget 50 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_ternary_ops.py \
  tests/test_virtual_noise_kernels.py > "$OUT/pytest_gpu.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -10
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-200 | head -12
tail -5 "$OUT/pytest_gpu.log"
