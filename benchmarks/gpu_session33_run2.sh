#!/bin/bash
# Session 33 run 2 (one Hopper GPU, ~4 min, no carry): the "wgmma" ternary matmul with the
# integer pair decode (two codes' float bits from ten integer operations, no conversions):
# compiled tests, then device time against a dense matmul and the Triton heuristic
# (bf16 x at M = 1-1024, float32 x at M = 4-64) on 4096^2 / 8192^2.
#   OUT=$OUT bash benchmarks/gpu_session33_run2.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
compiled_tests 150 tests/test_ternary_wgmma.py
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 160 python3 benchmarks/bench_ternary.py --part matmul --sweep wgmma \
  --batches 1,4,16,64,256,1024 --samples 5 --budget 130 --out "$OUT/matmul" \
  > "$OUT/matmul.log" 2>&1
echo "matmul exit $?"; quiet "$OUT/matmul.log" | grep -E "M=|Error" | cut -c1-150 | head -60
timeout 70 python3 benchmarks/bench_ternary.py --part matmul --sweep wgmma --x-dtype float32 \
  --batches 4,16,64 --samples 5 --budget 45 --out "$OUT/matmul_f32" > "$OUT/matmul_f32.log" 2>&1
echo "matmul f32 exit $?"; quiet "$OUT/matmul_f32.log" | grep -E "M=|Error" | cut -c1-150 | head -30
