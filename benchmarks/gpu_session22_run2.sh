#!/bin/bash
# Session 22 run 2 (one H200): the packed matmul's dot tiles with the code lanes joined into one
# tile of t (MatmulConfig.interleave_lanes: one dot per step on x as it is) against the
# per-lane dots and with t as the left operand (weights_lhs: warpgroup MMA from registers), the fma tiles, decode-then-GEMM and a dense bf16 matmul. The new kernel's
# tests compiled first. Run from a copy of the tree (.s22/, ignored by git):
# cd .s22 && OUT=$OUT bash <this>.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 150 python3 -m pytest -q -x tests/test_ternary_ops.py \
  -k "pallas and (interleaved_dot or matmul_kernel_matches or split_matmul)" > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
timeout 260 python3 benchmarks/bench_ternary.py --part matmul --sweep interleave --batches 4,8,16 \
  --budget 230 --out "$OUT/small" > "$OUT/small.log" 2>&1
grep -v Warn "$OUT/small.log" | sed 's/  */ /g' | cut -c1-170
timeout 180 python3 benchmarks/bench_ternary.py --part matmul --sweep interleave --batches 64,256,1024 \
  --budget 150 --out "$OUT/large" > "$OUT/large.log" 2>&1
grep -v Warn "$OUT/large.log" | sed 's/  */ /g' | cut -c1-170
