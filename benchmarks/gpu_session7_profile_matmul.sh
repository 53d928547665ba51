#!/bin/bash
# Session 7 (one H200): Nsight Compute on the packed matmul's one-row fma tiles (4096^2, 8192^2):
# where the overlap of issue and streaming is lost (stall reasons, bytes in flight, occupancy).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 240 ncu --clock-control none -k regex:"ternary_matmul" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats \
  python3 benchmarks/profile_session7.py matmul > "$OUT/ncu_matmul.txt" 2>&1
grep -E "^\s+[a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit Reg|Warp Cycles Per Issued|Issued Warp|No Eligible|Executed Instructions  |Grid Size|Block Size|Stall|stall" "$OUT/ncu_matmul.txt" | cut -c1-160 | head -80
