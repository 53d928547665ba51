#!/bin/bash
# Session 34 run 3 (one Hopper GPU, no carry, ~100 s: what was left of the session's device
# time): the 256-row batch tile and the steps in flight at 256 rows on 4096^2, then their
# compiled tests (exact products).
#   OUT=$OUT bash benchmarks/gpu_session34_run3.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
timeout 50 python3 benchmarks/explore_wgmma_tiles.py --budget 40 --cases 256x4096x4096 \
  --out "$OUT/tiles.json" > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-230
compiled_tests 50 tests/test_ternary_wgmma.py -k "variants"
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
