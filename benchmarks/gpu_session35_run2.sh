#!/bin/bash
# Session 35 run 2 (one Hopper GPU, no carry, ~2 min): the wgmma ternary kernel's new defaults
# (a step in flight, 256-row batch tiles, the heuristic's rows 16-256 for 16-bit x): its
# compiled tests, then the default path against a bf16 matmul at 16 and 256 rows.
#   OUT=$OUT bash benchmarks/gpu_session35_run2.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 110 tests/test_ternary_wgmma.py
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 60 python3 benchmarks/explore_wgmma_tiles.py --budget 45 \
  --cases 256x4096x4096,16x8192x8192 --out "$OUT/tiles.json" > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-200
