#!/bin/bash
# Session 16 (one GPU), run 1: cases no GPU had compiled, and why the counter update with fewer
# instructions is slower in float32.
# 1. Antithetic pairs with per-individual x at batch 128-512 (two input tiles a pipeline
#    step), forward and VJP compiled against the reference (pytest, GPU-only test).
# 2. in = 4500 compiled against the reference; the gradient's lane accumulators timed
#    beside the default configs.
# 3. Nsight Compute on main's frozen counter update and the working tree's (centres re-read
#    for the tick), 8192^2 float32 and bfloat16: stall reasons per issued instruction and
#    memory traffic.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_virtual_noise_kernels.py \
  -k "large_batch" > "$OUT/pairs_large_batch.log" 2>&1; echo "pytest exit $?"
tail -4 "$OUT/pairs_large_batch.log"
timeout 120 python3 benchmarks/bench_virtual_noise.py --check --skip-noise-bits --only x4500 \
  --budget 100 --out "$OUT" --tag check_x4500 > "$OUT/check_x4500.log" 2>&1; echo "x4500 exit $?"
quiet < "$OUT/check_x4500.log" | grep -E "check|PASS|FAIL|rel_err" | cut -c1-160 | tail -8
timeout 150 python3 benchmarks/bench_virtual_noise.py --sweep --only "sweep gradient" \
  --budget 120 --out "$OUT" --tag sweep_gradient > "$OUT/sweep_gradient.log" 2>&1
echo "sweep exit $?"; quiet < "$OUT/sweep_gradient.log" | cut -c1-170 | tail -16
timeout 240 ncu --clock-control none -k regex:"ternary_counter_update" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active" \
  python3 benchmarks/profile_counter_update.py > "$OUT/ncu_updates.txt" 2>&1; echo "ncu exit $?"
grep -E "^(frozen|new) |ternary_counter_update|Duration|Registers Per|Achieved Occupancy|dram__bytes|lts__t_bytes|inst_executed.sum|stalled" \
  "$OUT/ncu_updates.txt" | awk '$NF+0 > 0.05 || /ternary|Duration|Registers|Occupancy|bytes|inst_exec/' | cut -c1-120 | head -120
