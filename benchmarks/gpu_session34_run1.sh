#!/bin/bash
# Session 34 run 1 (one Hopper GPU, ~8 min, no carry): the packed matmul's Mosaic GPU kernel
# beyond the heuristic's tiles. Compiled tests (the new variants bit for bit), then
# explore_wgmma_tiles.py (steps in flight, four warpgroups, 256-row batch tiles, splits;
# bf16 x at M = 1-1024 on 4096^2 / 8192^2), then Nsight Compute on the base kernel.
#   OUT=$OUT bash benchmarks/gpu_session34_run1.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 170 tests/test_ternary_wgmma.py
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
timeout 270 python3 benchmarks/explore_wgmma_tiles.py --budget 240 --out "$OUT/tiles.json" \
  > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-230
timeout 120 ncu --clock-control none \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section InstructionStats --section ComputeWorkloadAnalysis \
  python3 benchmarks/profile_matmul.py "16x4096x4096:method='wgmma'" \
  "16x4096x4096:method='wgmma',block_n=256,split_k=8" "1x8192x8192:method='wgmma'" \
  > "$OUT/ncu.txt" 2>&1
echo "ncu exit $?"
grep -E "^  [a-zA-Z_0-9]+.*\(|^case|Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|Executed Ipc|Pipe|Utilization" \
  "$OUT/ncu.txt" | sed 's/  */ /g' | cut -c1-140 | head -80
gzip -f "$OUT/ncu.txt"
