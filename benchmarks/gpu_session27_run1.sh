#!/bin/bash
# Session 27 run 1 (one H100 or H200; not run in session 27, which got no machine). Set up here:
#   mkdir .s27b && cp -r jaxnoise benchmarks tests pyproject.toml .s27b/ && rm -rf .s27b/benchmarks/results
#   mkdir .s26 && git archive 2f30dc0 jaxnoise benchmarks | tar -x -C .s26 && rm -rf .s26/benchmarks/results
#   (2f30dc0: session 27's start), and EGGROLL's noiser files as .peers/hyperscalees_noiser/,
# then carry .s27b, .s26, .peers and run `cd .s27b && OUT=$OUT bash benchmarks/gpu_session27_run1.sh`.
# 1. Compiled tests of the fused forward, also with LowRankLinearConfig.mainloop_noise (each
#    component's noise hashed during one step of the GEMM's main loop, the per-pair vectors
#    loaded before it).
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
