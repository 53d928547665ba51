#!/bin/bash
# Session 34 run 2 (one Hopper GPU, no carry, about $BUDGET seconds, default 220): run 1
# without the four-warpgroup tiles (block_n=256 hung there). explore_wgmma_tiles.py first
# (steps in flight, 256-row batch tiles, splits; bf16), then the compiled tests of the
# variants, then Nsight Compute on the Mosaic kernel alone (XLA's autotuner off: it hung
# under the profiler in run 1).
#   OUT=$OUT BUDGET=220 bash benchmarks/gpu_session34_run2.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
BUDGET=${BUDGET:-220}
explore=$((BUDGET * 55 / 100)); tests=$((BUDGET * 25 / 100)); profile=$((BUDGET * 20 / 100))
timeout $((explore + 15)) python3 benchmarks/explore_wgmma_tiles.py --budget $explore \
  --cases 256x4096x4096,16x4096x4096,1024x4096x4096,256x8192x8192,16x8192x8192 \
  --out "$OUT/tiles.json" > "$OUT/tiles.log" 2>&1
echo "tiles exit $?"; quiet "$OUT/tiles.log" | grep -E "^M=|Error" | cut -c1-230
compiled_tests $tests tests/test_ternary_wgmma.py -k "variants"
grep -E "FAILED|Error|assert" "$OUT/tests.log" | head -12
XLA_FLAGS=--xla_gpu_autotune_level=0 timeout $profile ncu --clock-control none \
  -k regex:anonymous_mosaic \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section LaunchStats --section InstructionStats --section ComputeWorkloadAnalysis \
  python3 benchmarks/profile_matmul.py "16x4096x4096:method='wgmma'" \
  "16x4096x4096:method='wgmma',in_flight=2" > "$OUT/ncu.txt" 2>&1
echo "ncu exit $?"
grep -E "^  [a-zA-Z_0-9]+.*\(|^case|Duration|DRAM Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|Executed Ipc|Pipe|Utilization" \
  "$OUT/ncu.txt" | sed 's/  */ /g' | cut -c1-140 | head -90
gzip -f "$OUT/ncu.txt"
