#!/bin/bash
# Session 27 run 2 (one H100 or H200), from a copy of this tree (.s27b: each component's noise
# hashed during one step of the GEMM's main loop, while that step's wgmma runs) with .s27 (only
# the per-pair vectors loaded before the GEMM), the tree before both (.s26, commit 2f30dc0) and
# EGGROLL's noiser files (.peers) beside it.
# Rank 4's fused Mosaic GEMM takes ~9 us more than rank 1's (session 25, H100: 181.8 against
# ~172.9 us) although the count's integer work did not matter (popc was no faster).
# 1. The fused forward's compiled tests.
# 2. EGGROLL's benchmark, bf16 and f32, ranks 1 and 4: this tree, .s27's, .s26's (same run).
# 3. Nsight Compute on .s26's fused forward (profile_fused_forward.py, bf16, ranks 1 and 4):
#    the sections of every kernel, then per-SASS-instruction stall samples of the GEMM.
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 90 tests/test_low_rank.py -k "hopper"
bench() {  # bench TREE RANKS BUDGET
  local name
  name=$(basename "$(cd "$1" && pwd)")
  (cd "$1" && PYTHONPATH=. timeout $(($3 + 15)) python3 benchmarks/bench_low_rank.py --bench \
    --ranks "$2" --kinds binomial --only "inference|jaxnoise|eggroll" \
    --skip "materialized|step|triton" --budget "$3" --eggroll-path ../.peers \
    --out "$OUT/bench_$name" > "$OUT/bench_$name.log" 2>&1)
  echo "== $name"; quiet "$OUT/bench_$name.log" | grep -v "^{" | tail -12
}
bench . 1,4 60
bench ../.s27 1,4 50
bench ../.s26 1,4 50
cd ../.s26
timeout 120 ncu --clock-control none --section SpeedOfLight --section LaunchStats \
  --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section InstructionStats --section SourceCounters \
  python3 benchmarks/profile_fused_forward.py bf16:1 bf16:4 > "$OUT/ncu_fused.txt" 2>&1
echo "ncu exit $?"
grep -E "^case|\(1, 1\)x\(|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|Stall|stall" \
  "$OUT/ncu_fused.txt" | cut -c1-150 | head -100
gemm=$(grep -m1 -E "\(132, 1, 1\)x\(384, 1, 1\)" "$OUT/ncu_fused.txt" | awk '{print $1}')
echo "gemm kernel: $gemm"
gzip -f "$OUT/ncu_fused.txt"
if [ -n "$gemm" ]; then
  timeout 80 ncu --clock-control none -k "$gemm" --launch-skip 1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --page source --csv --print-source sass \
    python3 benchmarks/profile_fused_forward.py bf16:4 > "$OUT/sass_r4.csv" 2>&1
  echo "sass r4 exit $? lines $(wc -l < "$OUT/sass_r4.csv")"
  head -3 "$OUT/sass_r4.csv" | cut -c1-400
  gzip -f "$OUT/sass_r4.csv"
fi
