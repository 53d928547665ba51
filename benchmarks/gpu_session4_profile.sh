#!/usr/bin/env bash
# Nsight Compute on the low-rank forward's kernels (profile_low_rank.py).
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
timeout 200 ncu --clock-control none -k regex:"low_rank|explore|gemm|nvjet|xmma" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  python3 benchmarks/profile_low_rank.py > "$OUT/ncu_low_rank.txt" 2>&1
grep -E "^\s+[a-zA-Z_].*\(|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit Registers|Warp Cycles Per Issued|Issue Slots Busy|Grid Size|Block Size|Local Memory|Shared Memory Configuration Size|Dynamic Shared" "$OUT/ncu_low_rank.txt" | cut -c1-150 | head -150
