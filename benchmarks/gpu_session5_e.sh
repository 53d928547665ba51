#!/usr/bin/env bash
# Session 5 on one H200, fifth call (about 4.5 minutes): the ternary heuristics as merged,
# each part cut short after its first cases (the heuristic configs come first).
#   OUT=/dir bash benchmarks/gpu_session5_e.sh      Files: $OUT/bench_ternary.txt, JSON per part.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="${PYTHONPATH:-}:."
LOG="$OUT/bench_ternary.txt"; : > "$LOG"
run() {  # run TIMEOUT PART BUDGET
  echo "=== part $2 (budget $3 s, timeout $1 s) ===" >> "$LOG"
  timeout "$1" python3 benchmarks/bench_ternary.py --part "$2" --budget "$3" --out "$OUT" \
    2>&1 | grep -v -E "Warning|warn\(" >> "$LOG"
  echo "=== part $2 exit ${PIPESTATUS[0]} ===" >> "$LOG"
}
run 75 check 45
run 60 update 35
run 75 matmul 50
run 60 from_io 35
