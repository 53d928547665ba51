#!/bin/bash
# Session 29 run 4 (the same H200 as runs 2-3): where the LM's ES step spends its time over
# batch inference, by kernel (CUPTI): bf16 at pop 16,384, ranks 1 and 4.
#   OUT=$OUT bash benchmarks/gpu_session29_run4.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
for rank in 1 4; do
  timeout 200 python3 benchmarks/profile_lm_step.py --dtype bfloat16 --pop 16384 --rank $rank \
    --out "$OUT" > "$OUT/profile_r$rank.log" 2>&1
  echo "rank $rank exit $?"
  quiet "$OUT/profile_r$rank.log" | grep -E "^==|^  " | head -60
done
