#!/bin/bash
# Session 15 (one GPU), run 4: Nsight Compute on main's frozen counter update and the new one
# (8192^2, float32 and bfloat16 gradients): registers, occupancy, issue and stalls. Run 2 found
# the new kernel 12% slower in float32 with 21% fewer SASS instructions; is it occupancy?
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 200 ncu --clock-control none -k regex:"ternary_counter_update" \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section LaunchStats --section InstructionStats \
  python3 benchmarks/profile_counter_update.py > "$OUT/ncu_updates.txt" 2>&1; echo "ncu exit $?"
grep -E "^(frozen|new) |Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit Reg|Warp Cycles Per Issued|Issued Ipc|No Eligible|Executed Instructions  |Block Size|Dynamic Shared" \
  "$OUT/ncu_updates.txt" | cut -c1-120 | head -80
