#!/bin/bash
# Session 37 run 3 (one Hopper GPU, no carry, ~5 min): MatmulConfig.substeps (two 64-deep steps
# a pipeline buffer, the heuristic's choice up to 16-row tiles) through the compiled tests, then
# the heuristic's tiles against the other number of steps a buffer and against the Triton
# choice and a dense matmul, from 2 to 256 rows; the pad's rows cut before XLA's slab sum.
#   OUT=$OUT bash benchmarks/gpu_session37_run3.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 120 tests/test_ternary_wgmma.py -k "compiled and not lower"
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 240 python3 benchmarks/explore_wgmma_tiles.py --budget 220 \
  --variants dense,triton,base,substeps1,substeps2 \
  --cases 4x4096x4096,8x4096x4096,13x4096x4096,2x8192x8192,4x8192x8192,32x4096x4096,64x8192x8192,256x4096x4096,256x8192x8192,2x4096x4096 \
  --out "$OUT/tiles.json" > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-200
