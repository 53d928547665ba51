#!/bin/bash
# Session 37 run 3 (one Hopper GPU, no carry, ~5 min): MatmulConfig.substeps (two 64-deep steps
# a pipeline buffer, the heuristic's choice up to 16-row tiles) through the compiled tests, x
# unpadded (TMA_PADS_ROWS, off by default) through its own; then the heuristic's tiles against
# the other number of steps a buffer, x unpadded, the Triton choice and a dense matmul, from 1
# to 32 rows (the pad's rows now cut before XLA's slab sum).
#   OUT=$OUT bash benchmarks/gpu_session37_run3.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 100 tests/test_ternary_wgmma.py -k "compiled and not lower and not unpadded"
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 60 python3 -m pytest -q tests/test_ternary_wgmma.py -k "compiled_unpadded" \
  > "$OUT/tests_unpadded.log" 2>&1
tail -2 "$OUT/tests_unpadded.log"; grep -E "^E .*Error|Mismatch" "$OUT/tests_unpadded.log" | head -6
timeout 170 python3 benchmarks/explore_wgmma_tiles.py --budget 150 \
  --variants dense,triton,base,substeps1,substeps2,tma_rows \
  --cases 4x4096x4096,2x4096x4096,4x8192x8192,2x8192x8192,8x4096x4096,1x4096x4096,13x4096x4096,32x4096x4096 \
  --out "$OUT/tiles.json" > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-200
