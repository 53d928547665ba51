#!/bin/bash
# Session 25 run 2 (one H100 or H200), from a copy of this tree (.s25) with session 24's
# tree (.s24, commit 62a0d7f) and EGGROLL's noiser files (.peers) carried beside it:
# 1. the fused low-rank forward's compiled tests (the epilogue's popc bit count, the operands
#    kernel split over programs);
# 2. EGGROLL's benchmark at ranks 1 and 4 (EGGROLL's code beside it), then session 24's tree
#    (SWAR epilogue, one operands program per pair) at rank 4.
# (Cut to fit the session's last device time: the finiteness check's HLO did not run.)
source "$(dirname "$0")/_gpu_run_preamble.sh"
compiled_tests 60 tests/test_low_rank.py -k "hopper"
bench() {  # bench TREE RANKS BUDGET
  local name
  name=$(basename "$(cd "$1" && pwd)")
  (cd "$1" && PYTHONPATH=. timeout $(($3 + 15)) python3 benchmarks/bench_low_rank.py --bench \
    --ranks "$2" --kinds binomial --only "inference|jaxnoise|eggroll" \
    --skip "materialized|step|triton" --budget "$3" --eggroll-path ../.peers \
    --out "$OUT/bench_$name" > "$OUT/bench_$name.log" 2>&1)
  echo "== $name"; quiet "$OUT/bench_$name.log" | grep -v "^{" | tail -12
}
bench . 1,4 70
bench ../.s24 4 40
