#!/bin/bash
# Ready, not run (session 32 had no device time left); no carry, ~3 min.
# Session 32 run 8: Nsight Compute on the LM's 512x512 layer (16,384 members of 64 rows, bf16,
# rank 1): XLA's GEMM (cuBLAS) against the fused GEMM with the default (chained) config, to
# see what bounds the fused GEMM there (1.048 against 0.830 ms in run 5).
#   OUT=$OUT bash benchmarks/gpu_session32_run8.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
for shape in 512x512 2048x512; do
  timeout 75 ncu --clock-control none -k regex:"nvjet|mosaic" \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
    --section SchedulerStats --section Occupancy --section LaunchStats \
    python3 benchmarks/profile_lm_layer.py --shape $shape --rank 1 > "$OUT/ncu_$shape.txt" 2>&1
  echo "ncu $shape exit $?"
  grep -E "^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\) Throughput|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Issued Warp Per|No Eligible|Mem Busy|Max Bandwidth|L2 Hit|Mem Pipes" \
    "$OUT/ncu_$shape.txt" | sed 's/  */ /g' | cut -c1-120 | head -60
  gzip -f "$OUT/ncu_$shape.txt"
done
