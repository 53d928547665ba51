#!/bin/bash
# Session 36 run 3, ready, not run (one Hopper GPU, no carry, ~3 min): the wgmma ternary
# kernel's compiled tests (the kernel's epilogue, x in its own order, the cluster's sum and two
# steps a stage, both off by default until these pass), then the default path against a bf16
# matmul with the cluster_sum and substeps2 variants beside it.
#   OUT=$OUT bash benchmarks/gpu_session36_run3.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 110 tests/test_ternary_wgmma.py -k "compiled and not lower"
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 100 python3 benchmarks/explore_wgmma_tiles.py --budget 75 \
  --cases 16x4096x4096,1024x4096x4096,256x4096x4096,16x8192x8192 \
  --out "$OUT/tiles.json" > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-230
