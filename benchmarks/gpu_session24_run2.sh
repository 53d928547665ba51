#!/bin/bash
# Session 24 run 2 (one H100 or H200). (1) Nsight Compute on the packed matmul's joined dot
# tiles at 8 rows, 4096^2: the 1-stage heuristic, 4 steps in a 2-stage pipeline with the lanes
# as they are and transposed, the transposed lanes in 1 stage (run 1: 18.8 against 13.0 us),
# and 16 rows at 8192^2: stalls, occupancy, shared-memory bank conflicts, pipes. (2) The
# counter update against copy bandwidth and the reduce-metric against pure JAX on this card.
source "$(dirname "$0")/_gpu_run_preamble.sh"
timeout 200 ncu --clock-control none -k regex:"ternary_matmul" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active" \
  python3 benchmarks/profile_matmul.py 8x4096x4096 8x4096x4096:num_stages=2,split_k=4 \
  8x4096x4096:num_stages=2,split_k=4,transposed_lane_loads=True \
  8x4096x4096:transposed_lane_loads=True 16x8192x8192 > "$OUT/ncu_matmul.txt" 2>&1
echo "ncu exit $?"
grep -E "^case|ternary_matmul|Duration|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Static Shared|Achieved Occupancy|Theoretical Occupancy|Block Limit|inst_executed|stalled|Bank|Shared (Load|Store)|Warp Cycles Per Issued|Issue Slots Busy|Memory Throughput|DRAM Throughput|warps_active" \
  "$OUT/ncu_matmul.txt" | awk '!/stalled/ || $NF+0 > 0.3' | cut -c1-130 | head -190
gzip -f "$OUT/ncu_matmul.txt"
timeout 130 python3 benchmarks/bench_ternary.py --part update --budget 80 --out "$OUT/update" \
  > "$OUT/update.log" 2>&1
quiet "$OUT/update.log" | head -30
timeout 150 python3 benchmarks/bench_reduce_metric.py --kinds binomial > "$OUT/reduce_metric.log" 2>&1
quiet "$OUT/reduce_metric.log" | head -40
