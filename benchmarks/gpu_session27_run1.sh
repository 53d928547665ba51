#!/bin/bash
# Session 27 run 1 (one H100 or H200; not run in session 27, which got no machine), from a copy
# of this tree (`mkdir .s27 && cp -r jaxnoise benchmarks tests pyproject.toml .s27/`, carry it,
# `cd .s27 && OUT=$OUT bash benchmarks/gpu_session27_run1.sh`). Nsight Compute on the fused
# low-rank forward of EGGROLL's layer (profile_fused_forward.py, bf16): rank 4's Mosaic GEMM
# took ~9 us more than rank 1's (session 25, H100: 181.8 against ~172.9 us) although the
# count's integer work did not matter (popc was no faster). Where do its warps wait in the
# epilogue? (1) The sections of every kernel at ranks 1 and 4; (2) per-SASS-instruction stall
# samples of the rank-4 GEMM.
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
timeout 150 ncu --clock-control none --section SpeedOfLight --section LaunchStats \
  --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section InstructionStats --section SourceCounters \
  python3 benchmarks/profile_fused_forward.py bf16:1 bf16:4 > "$OUT/ncu_fused.txt" 2>&1
echo "ncu exit $?"
grep -E "^case|\(1, 1\)x\(|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|Stall|stall" \
  "$OUT/ncu_fused.txt" | cut -c1-150 | head -120
gemm=$(grep -m1 -E "\(132, 1, 1\)x\(384, 1, 1\)" "$OUT/ncu_fused.txt" | awk '{print $1}')
echo "gemm kernel: $gemm"
gzip -f "$OUT/ncu_fused.txt"
if [ -n "$gemm" ]; then
  for case in bf16:4; do
    tag=${case//:/_}
    timeout 100 ncu --clock-control none -k "$gemm" --launch-skip 1 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
      python3 benchmarks/profile_fused_forward.py "$case" > "$OUT/sass_$tag.csv" 2>&1
    echo "sass $case exit $? lines $(wc -l < "$OUT/sass_$tag.csv")"
    head -3 "$OUT/sass_$tag.csv" | cut -c1-300
    gzip -f "$OUT/sass_$tag.csv"
  done
fi
