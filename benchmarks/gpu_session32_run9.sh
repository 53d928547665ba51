#!/bin/bash
# Ready, not run (session 32 had no device time left); no carry, ~3-4 min.
# Session 32 run 9: the packed ternary matmul as a Mosaic GPU GEMM with W decoded in registers
# (benchmarks/explore_mosaic_ternary.py, compiled offline only): (1) against ternary_decode and
# a float32 matmul (odd batches, several K splits, C = 1-11); (2) device time beside a bf16
# matmul and the library's ternary_matmul at batch 1, 4, 16, 256, 1024 on 4096^2 and 8192^2.
#   OUT=$OUT bash benchmarks/gpu_session32_run9.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
timeout 100 python3 benchmarks/explore_mosaic_ternary.py --gpu-check --out "$OUT/check" \
  > "$OUT/check.log" 2>&1
echo "check exit $?"; quiet "$OUT/check.log" | grep -E "^\{|Error" | tail -8
timeout 200 python3 benchmarks/explore_mosaic_ternary.py --bench --out "$OUT/bench" \
  > "$OUT/bench.log" 2>&1
echo "bench exit $?"; quiet "$OUT/bench.log" | grep -E "^\{|Error" | tail -12
