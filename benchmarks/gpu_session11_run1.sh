#!/bin/bash
# Session 11 (one H200), run 1: float32 operands as three bfloat16 pieces (split_float32) and
# the input gradient split along out / decoded. The compiled matmul checks, the matmul kernel
# tests compiled, then the forward with float32 x at 4-1024 rows against a dense float32
# matmul and session 10's configs (fma tiles of all rows; decode with a float32 GEMM).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 130 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 100 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_ternary_ops.py \
  -k "(matmul or pieces or input_grad) and not interpret" > "$OUT/pytest.log" 2>&1
timeout 250 python3 benchmarks/bench_ternary.py --part matmul --x-dtype float32 \
  --batches 4,8,16,32,64,256,1024 --before-config session10 --budget 200 \
  --out "$OUT/forward_f32" > "$OUT/forward_f32.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -10
tail -3 "$OUT/pytest.log"
grep -v Warn "$OUT/forward_f32.log" | grep -v _warn_once | sed 's/  */ /g' | cut -c1-170 | head -90
