#!/bin/bash
# Session 24 run 1 (one H100 or H200; session 23's run, which never got a GPU): the packed
# matmul's joined dot tiles in Triton's software pipeline with the packed lanes loaded
# transposed (MatmulConfig.transposed_lane_loads) against as they are, at 4-16 rows (several
# steps per program) and 64-1024 rows (GEMM tiles, 2-4 stages), beside the heuristic and a
# dense bf16 matmul in the same run. The compiled tests first.
source "$(dirname "$0")/_gpu_run_preamble.sh"
compiled_tests 150 tests/test_ternary_ops.py \
  -k "pallas and (interleaved_dot or matmul_kernel_matches or split_matmul)"
short() { quiet "$1" | sed 's/MatmulConfig//; s/interleave_lanes=True, weights_lhs=True/JL/;
  s/transposed_lane_loads=True/TR/'; }
timeout 270 python3 benchmarks/bench_ternary.py --part matmul --sweep pipeline --batches 4,8,16 \
  --budget 240 --out "$OUT/small" > "$OUT/small.log" 2>&1
short "$OUT/small.log"
timeout 150 python3 benchmarks/bench_ternary.py --part matmul --sweep pipeline --batches 64,256,1024 \
  --budget 120 --out "$OUT/large" > "$OUT/large.log" 2>&1
short "$OUT/large.log"
