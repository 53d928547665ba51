#!/bin/bash
# Session 23 run 1 (one H200): the packed matmul's joined dot tiles in Triton's software
# pipeline with the packed lanes loaded transposed (MatmulConfig.transposed_lane_loads) against
# as they are, at 4-16 rows (several steps per program) and 64-1024 rows (GEMM tiles, 2-4
# stages), beside the heuristic and a dense bf16 matmul. The compiled tests first.
# Run from a copy of the tree (.s23/, ignored by git): cd .s23 && OUT=$OUT bash <this>.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 150 python3 -m pytest -q -x tests/test_ternary_ops.py \
  -k "pallas and (interleaved_dot or matmul_kernel_matches or split_matmul)" > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
timeout 270 python3 benchmarks/bench_ternary.py --part matmul --sweep pipeline --batches 4,8,16 \
  --budget 240 --out "$OUT/small" > "$OUT/small.log" 2>&1
grep -v Warn "$OUT/small.log" | grep -v "_warn_once\|UserWarning" | sed 's/  */ /g; s/MatmulConfig//; s/interleave_lanes=True, weights_lhs=True/JL/; s/transposed_lane_loads=True/TR/' | cut -c1-175
timeout 150 python3 benchmarks/bench_ternary.py --part matmul --sweep pipeline --batches 64,256,1024 \
  --budget 120 --out "$OUT/large" > "$OUT/large.log" 2>&1
grep -v Warn "$OUT/large.log" | grep -v "_warn_once\|UserWarning" | sed 's/  */ /g; s/MatmulConfig//; s/interleave_lanes=True, weights_lhs=True/JL/; s/transposed_lane_loads=True/TR/' | cut -c1-175
