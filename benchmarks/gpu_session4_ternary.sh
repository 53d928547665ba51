#!/usr/bin/env bash
# Session 4 (issue 14, ternary) in one GPU run of at most ~5 minutes on one H200.
# Run from the repository root:  OUT=/some/dir bash benchmarks/gpu_session4_ternary.sh
#
# Four parts, each under `timeout`; each stops starting new cases after its --budget
# (seconds) and then writes its JSON, so the timeouts (budget + ~25 s) never cut a file:
#   1. check   : every new kernel compiled here vs the pure-JAX reference (max errors,
#                codes off by one) -- read this first.
#   2. update  : counter_update before/after as % of copy bandwidth + config sweep.
#   3. matmul  : ternary_matmul before/after vs bf16 matmul and decode-then-matmul,
#                M = 1, 4, 16, 256, 1024 on 4096^2 and 8192^2 + config sweeps.
#   4. from_io : counter_update_from_io before/after vs XLA GEMM + fused update, with
#                temp memory from memory_analysis().
# Files under $OUT (5): ternary_{check,update,matmul,from_io}.json, bench_ternary.txt.
set -u
export OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-}:."
LOG="$OUT/bench_ternary.txt"
: > "$LOG"
run() {  # run TIMEOUT PART BUDGET
  echo "=== part $2 (budget $3 s, timeout $1 s) ===" | tee -a "$LOG"
  timeout "$1" python3 benchmarks/bench_ternary.py --part "$2" --budget "$3" --out "$OUT" \
    2>&1 | grep -v -E "Warning|warn\(" | tee -a "$LOG"
  echo "=== part $2 exit ${PIPESTATUS[0]} ===" | tee -a "$LOG"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$LOG"
run 55 check 30
run 80 update 55
run 110 matmul 85
run 50 from_io 30
