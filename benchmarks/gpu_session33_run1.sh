#!/bin/bash
# Session 33 run 1 (one Hopper GPU, ~6 min, no carry): the packed ternary matmul's Mosaic GPU
# kernel (MatmulConfig(method="wgmma"), jaxnoise/ops/ternary/mosaic_gpu_matmul.py), first run on
# a GPU: its compiled tests (exact products at odd shapes, every dtype, several splits; the
# default path and its gradient), then device time against a dense bf16 matmul and the Triton
# heuristic at M = 1-1024 on 4096^2 / 8192^2 (bf16 x), and float32 x at M = 4, 16, 256; then
# the chained-tile test of the low-rank GEMM that had not run on a GPU (session 32's spy).
#   OUT=$OUT bash benchmarks/gpu_session33_run1.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
compiled_tests 150 tests/test_ternary_wgmma.py
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 200 python3 benchmarks/bench_ternary.py --part matmul --sweep wgmma \
  --batches 1,2,4,8,16,64,256,1024 --samples 5 --budget 170 --out "$OUT/matmul" \
  > "$OUT/matmul.log" 2>&1
echo "matmul exit $?"; quiet "$OUT/matmul.log" | grep -E "^M=|Error" | head -70
timeout 90 python3 benchmarks/bench_ternary.py --part matmul --sweep wgmma --x-dtype float32 \
  --batches 4,16,256 --samples 5 --budget 60 --out "$OUT/matmul_f32" > "$OUT/matmul_f32.log" 2>&1
echo "matmul f32 exit $?"; quiet "$OUT/matmul_f32.log" | grep -E "^M=|Error" | head -30
timeout 100 python3 -m pytest -q -x tests/test_low_rank.py -k pipelined_tiles_compiled \
  > "$OUT/chain_tests.log" 2>&1
tail -2 "$OUT/chain_tests.log"
