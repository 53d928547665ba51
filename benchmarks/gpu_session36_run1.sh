#!/bin/bash
# Session 36 run 2 (one Hopper GPU, no carry, ~3 min): the wgmma ternary kernel with x in its
# own order (no XLA gather) and its own epilogue (no XLA sum and transpose: one slab, or the
# slabs summed in a cluster): its compiled tests, then the default path against a bf16 matmul
# at 16, 256 and 1024 rows. (Run 3's script, gpu_session36_run3.sh, follows the fixes it led to.)
#   OUT=$OUT bash benchmarks/gpu_session36_run1.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 220 tests/test_ternary_wgmma.py
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 200 python3 benchmarks/explore_wgmma_tiles.py --budget 170 \
  --cases 16x4096x4096,256x4096x4096,1024x4096x4096,16x8192x8192,256x8192x8192 \
  --out "$OUT/tiles.json" > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-230
