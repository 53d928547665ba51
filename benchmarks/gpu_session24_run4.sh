#!/bin/bash
# Session 24 run 4 (one H100 or H200): the rest of issue 14's figures on this card, the
# heuristics first within each budget: the packed matmul at 1-3 rows against a dense bf16
# matmul, and counter_update_from_io against XLA's GEMM plus the fused update.
source "$(dirname "$0")/_gpu_run_preamble.sh"
timeout 110 python3 benchmarks/bench_ternary.py --part matmul --batches 1,2,3 --budget 70 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
quiet "$OUT/matmul.log" | head -24
timeout 130 python3 benchmarks/bench_ternary.py --part from_io --budget 80 \
  --out "$OUT/from_io" > "$OUT/from_io.log" 2>&1
quiet "$OUT/from_io.log" | head -30
