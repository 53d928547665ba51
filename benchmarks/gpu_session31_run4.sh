#!/bin/bash
# Session 31 run 4 (after runs 1-3, the 64-row fused GEMM on by default): the LM's layers one
# at a time, the fused forward and its GEMM knobs against XLA's GEMM (probe_lm_layers.py, bf16,
# pop 16,384 of 64 rows, ranks 1 and 4).
#   OUT=$OUT bash benchmarks/gpu_session31_run4.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
for rank in 1 4; do
  timeout 140 python3 benchmarks/probe_lm_layers.py --ranks $rank --out "$OUT/r$rank" \
    > "$OUT/lm_layers_r$rank.log" 2>&1
  echo "rank $rank exit $?"; grep -E "^rank|Error" "$OUT/lm_layers_r$rank.log" | cut -c1-400
done
