#!/bin/bash
# Session 37 run 4 (one Hopper GPU, no carry, ~2.5 min): run 3 cut to what the session's last
# device time fits: the compiled tests of two steps a buffer (the heuristic's default up to
# 16-row tiles) and of x unpadded (TMA_PADS_ROWS), then 2-8 rows at 4096^2 with x unpadded
# beside the default, the Triton choice and a dense matmul.
#   OUT=$OUT bash benchmarks/gpu_session37_run4.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 70 tests/test_ternary_wgmma.py \
  -k "compiled and not lower and (two_steps or as_default or unpadded)"
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 70 python3 benchmarks/explore_wgmma_tiles.py --budget 55 \
  --variants dense,triton,base,tma_rows --cases 4x4096x4096,2x4096x4096,8x4096x4096 \
  --out "$OUT/tiles.json" > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-200
