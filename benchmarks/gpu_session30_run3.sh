#!/bin/bash
# Session 30 run 3 (after run 1, on the same kind of card): run 1's failures mended (the member
# dots' factor rows at DOT_COLS a pair, so Mosaic's layout inference can prove every copy's
# row start a multiple of its 8-row tile; pl.multiple_of on the 64-row starts). (1) The
# compiled tests of run 1 (less the one-row ones, passed there); (2) the LM's step by kernel with the GEMM forming x B (ranks 1
# and 4) and with the operands kernel (rank 1), 100 s each (run 1's 65 s cut the latter).
#   OUT=$OUT bash benchmarks/gpu_session30_run3.sh ["member_dots 1" ...]
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
compiled_tests 100 tests/test_low_rank.py \
  -k "multi_row_members or split_gradient"
grep -E "^(FAILED|ERROR)|Failed to infer" "$OUT/tests.log" | head -5 | cut -c1-200
# Cases as arguments ("member_dots 1" ...), these by default.
[[ $# -gt 0 ]] || set -- "member_dots 1" "member_dots 4" "operands 1"
for case in "$@"; do
  set -- $case
  flags="--multi-row-fused"; [[ $1 == operands ]] && flags="$flags --no-member-dots"
  timeout 95 python3 benchmarks/profile_lm_step.py --dtype bfloat16 --pop 16384 --rank $2 \
    $flags --top 14 --out "$OUT/$1" > "$OUT/profile_$1_r$2.log" 2>&1
  echo "rank $2 $1 exit $?"; grep "^==" "$OUT/profile_$1_r$2.log"
  grep -E "Error|Failed" "$OUT/profile_$1_r$2.log" | head -3 | cut -c1-200
done
