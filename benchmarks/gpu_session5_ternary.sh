#!/usr/bin/env bash
# Session 5 (issue 14, ternary) in one GPU run of about 6 minutes on one H200.
# Run from the repository root:  OUT=/some/dir bash benchmarks/gpu_session5_ternary.sh
#
# Four parts, each under `timeout`; each stops starting new cases after its --budget
# (seconds), prints every row as it completes and rewrites its JSON after every case,
# so even a part cut by its timeout leaves all finished cases on disk:
#   1. check   : every kernel variant compiled once (small odd shapes) vs the pure-JAX
#                reference, heuristic choices first -- read this first.
#   2. update  : counter_update configs at 8192^2 f32/bf16, 1000x3996, 1536x2304
#                (% of copy bandwidth; best-guess candidates of every shape first).
#   3. matmul  : ternary_matmul at M = 1, 4, 16 on 4096^2 / 8192^2 vs bf16 matmul: the
#                heuristic, the fma grid, dot tiles; M = 64 dot vs decode last.
#   4. from_io : counter_update_from_io at M = 4096 (tiles, block_m, num_stages), then
#                M = 1024, vs XLA GEMM + update (temp memory of the heuristic).
# Timeouts sum to 405 s (budgets 45 + 80 + 120 + 55 s plus start-up and the last case).
# Files under $OUT (5): ternary_{check,update,matmul,from_io}.json, bench_ternary.txt.
set -u
export OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-}:."
LOG="$OUT/bench_ternary.txt"
: > "$LOG"
run() {  # run TIMEOUT PART BUDGET
  echo "=== part $2 (budget $3 s, timeout $1 s) ===" | tee -a "$LOG"
  timeout "$1" python3 -u benchmarks/bench_ternary.py --part "$2" --budget "$3" --out "$OUT" \
    2>&1 | grep --line-buffered -v -E "Warning|warn\(" | tee -a "$LOG"
  echo "=== part $2 exit ${PIPESTATUS[0]} ===" | tee -a "$LOG"
}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee -a "$LOG"
run 75 check 45
run 105 update 80
run 145 matmul 120
run 80 from_io 55
