#!/bin/bash
# Session 18 (one H200), run 3: Nsight Compute on the packed matmul at one and two rows
# (t from clamped adds): what bounds it at 22 us for 8192^2 where its instructions
# predict ~13 us. cd .s18 && OUT=$OUT bash benchmarks/gpu_session18_run3.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 200 ncu --clock-control none -k regex:"ternary_matmul" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis \
  --section WarpStateStats --section MemoryWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,regex:sm__inst_executed_pipe_.*\.avg\.pct_of_peak_sustained_active,dram__bytes_read.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active" \
  python3 benchmarks/profile_matmul.py > "$OUT/ncu_matmul.txt" 2>&1; echo "ncu exit $?"
grep -E "^case|ternary_matmul|Duration|Registers Per|Achieved Occupancy|dram__bytes|inst_executed|stalled|Throughput|Issue Slots|Executed Ipc|pipe_" \
  "$OUT/ncu_matmul.txt" | awk '!/stalled/ || $NF+0 > 0.1' | cut -c1-120 | head -150
gzip -f "$OUT/ncu_matmul.txt"
