#!/bin/bash
# Session 16 (one GPU), run 3: the final code.
# 1. The ternary kernel tests compiled; the counter update against the frozen 7fbab3d kernel
#    bit for bit (thorough suite, compiled).
# 2. Nsight Compute on the frozen and the new counter update (8192^2, float32 and bfloat16):
#    registers, stalls per issued instruction, memory traffic.
# 3. The gradient of a 32-values-per-word kind with the final heuristics (bench_gradient_lanes.py)
#    and the noise kinds' throughput (bench_virtual_noise.py --throughput --only 3000).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/update"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_ternary_ops.py -k "pallas or gpu" \
  > "$OUT/ternary_tests.log" 2>&1; echo "ternary tests exit $?"; tail -2 "$OUT/ternary_tests.log"
timeout 90 python3 benchmarks/baseline_update/check_counter_update.py --suite thorough \
  --no-reference > "$OUT/update/check_thorough.log" 2>&1; echo "thorough check exit $?"
quiet < "$OUT/update/check_thorough.log" | tail -1
timeout 150 ncu --clock-control none -k regex:"ternary_counter_update" \
  --section SpeedOfLight --section Occupancy --section LaunchStats \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,smsp__inst_executed.sum" \
  python3 benchmarks/profile_counter_update.py > "$OUT/ncu_updates.txt" 2>&1; echo "ncu exit $?"
grep -E "ternary_counter_update|Duration|Registers Per|Achieved Occupancy|inst_executed.sum|stalled_(long|wait|barrier|not_sel|math)" \
  "$OUT/ncu_updates.txt" | cut -c1-120 | head -48
timeout 100 python3 benchmarks/bench_gradient_lanes.py --budget 80 --out "$OUT" \
  > "$OUT/gradient_lanes.log" 2>&1; echo "lanes exit $?"
quiet < "$OUT/gradient_lanes.log" | grep -v '^{' | grep -E "before|heuristic|no lanes|cases" | cut -c1-110
timeout 150 python3 benchmarks/bench_virtual_noise.py --throughput --only 3000 --budget 120 \
  --out "$OUT" --tag throughput > "$OUT/throughput.log" 2>&1; echo "throughput exit $?"
quiet < "$OUT/throughput.log" | grep -v '^{' | cut -c1-200 | tail -24
