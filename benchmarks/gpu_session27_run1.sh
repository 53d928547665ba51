#!/bin/bash
# Session 27 run 1 (one H100 or H200), from a copy of this tree (.s27b) with the tree at the
# session's start (.s26, commit 2f30dc0), the tree before session 26's changes (.s26old,
# 29cf4d9, with this probe_es_step.py as probe_es_step_s26.py) and EGGROLL's noiser files
# (.peers) beside it.
# 1. Compiled tests of the fused forward (the per-pair vectors loaded before the GEMM; with
#    LowRankLinearConfig.mainloop_noise, each component's noise hashed during one step of the
#    GEMM's main loop).
# 2. EGGROLL's benchmark (bf16, f32; ranks 1, 4): this tree (the default epilogue schedule, and
#    the "mainloop noise" and "aligned noise" schedules as rows of their own) and EGGROLL,
#    then .s26's tree.
source "$(dirname "$0")/_gpu_run_preamble.sh"
OUT=$(realpath "$OUT")
# SHORT=1 (little device time left): the schedule tests and the bf16 rows only.
SHORT=${SHORT:-0}
if [ "$SHORT" = 1 ]; then
  compiled_tests 50 tests/test_low_rank.py -k "noise_schedule"
else
  compiled_tests 100 tests/test_low_rank.py -k "hopper"
fi
bench() {  # bench TREE ONLY BUDGET
  local name
  name=$(basename "$(cd "$1" && pwd)")
  (cd "$1" && PYTHONPATH=. timeout $(($3 + 30)) python3 benchmarks/bench_low_rank.py --bench \
    --ranks 1,4 --kinds binomial --only "$2" \
    --skip "materialized|step|triton" --budget "$3" --eggroll-path ../.peers \
    --out "$OUT/bench_$name" > "$OUT/bench_$name.log" 2>&1)
  echo "== $name"; quiet "$OUT/bench_$name.log" | grep -v "^{" | tail -16
}
if [ "$SHORT" = 1 ]; then
  bench . "inference bfloat16|jaxnoise bfloat16|eggroll bfloat16" 45
else
  bench . "inference|jaxnoise|eggroll" 90
  bench ../.s26 "inference|jaxnoise" 45
fi
