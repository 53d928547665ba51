#!/bin/bash
# Ran at commit f8e22d6 (run 1 with its first sweep list); the options it measured were
# removed after (no gain), so check that commit out to run it again.
# Session 8 (one H200): the packed matmul's fma tiles with several steps per program and the
# next step's codes prefetched in registers (MatmulConfig.prefetch_codes), against the same
# tiles without it and the session-7 heuristic; 16-row dot tiles with several (pipelined)
# steps at 4 and 16 rows; then Nsight Compute on the dot tiles at 4 rows (stall reasons).
# The matmul cases of the compiled check first.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 100 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 70 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 330 python3 benchmarks/bench_ternary.py --part matmul --batches 1,4,16 --budget 290 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
timeout 120 ncu --clock-control none -k regex:"ternary_matmul" \
  --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats \
  python3 benchmarks/profile_session7.py matmul 4 > "$OUT/ncu_matmul_m4.txt" 2>&1
gzip -f "$OUT/ncu_matmul_m4.txt"
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | head -10
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-180 | head -90
zcat "$OUT/ncu_matmul_m4.txt.gz" | grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Warp|No Eligible|Executed Instructions  |Grid Size|Stall|stall" | cut -c1-150 | head -40
