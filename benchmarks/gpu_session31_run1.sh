#!/bin/bash
# Session 31 run 1: session 30's mend of the 64-row fused GEMM, first on a GPU. (1) Its compiled
# tests, every case run (no -x), and the split gradient's; on a layout-inference failure, the
# first failing case again with Mosaic GPU's constraint system dumped; (2) the LM's step beside
# inference (profile_lm_step.py, bf16, pop 16,384): the 64-row path with the GEMM forming x B
# (ranks 1, 4), the default path (split gradient, members through the Triton operands), and
# the 64-row path with x B from the operands kernel.
#   OUT=$OUT bash benchmarks/gpu_session31_run1.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
timeout 170 python3 -m pytest -q tests/test_low_rank.py -k "multi_row_members or split_gradient" \
  > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -8 | cut -c1-220
first=$(grep -m1 -oE "^FAILED [^ ]+" "$OUT/tests.log" | cut -d' ' -f2)
if [[ -n $first ]]; then
  MOSAIC_GPU_DUMP_CONSTRAINT_SYSTEM=1 timeout 60 python3 -m pytest -q -x "$first" \
    > "$OUT/first_failure_dump.log" 2>&1
  grep -E "Error|prove" "$OUT/first_failure_dump.log" | head -4 | cut -c1-220
fi
profile() {  # NAME RANK FLAGS...
  local name=$1 rank=$2
  shift 2
  timeout 90 python3 benchmarks/profile_lm_step.py --dtype bfloat16 --pop 16384 --rank "$rank" \
    "$@" --top 14 --out "$OUT/$name" > "$OUT/profile_${name}_r${rank}.log" 2>&1
  echo "$name rank $rank exit $?"; grep "^==" "$OUT/profile_${name}_r${rank}.log"
  grep -E "Error|Failed" "$OUT/profile_${name}_r${rank}.log" | head -2 | cut -c1-200
}
profile member_dots 1 --multi-row-fused
profile default 1
profile member_dots 4 --multi-row-fused
profile operands 1 --multi-row-fused --no-member-dots
