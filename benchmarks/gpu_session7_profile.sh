#!/bin/bash
# Session 7 (one H200): Nsight Compute on the counter update (8192^2 f32 and bf16) and the
# reduce-metric (1024 x 2^20, default kind): issue, stalls, occupancy, instruction counts.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 240 ncu --clock-control none -k regex:"ternary_counter_update|virtual_reduce_metric" \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section LaunchStats --section InstructionStats \
  python3 benchmarks/profile_session7.py > "$OUT/ncu_session7.txt" 2>&1
grep -E "^\s+[a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|Issued Ipc|No Eligible|Executed Instructions  |Grid Size|Block Size|Stall" "$OUT/ncu_session7.txt" | cut -c1-150 | head -120
