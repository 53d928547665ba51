#!/bin/bash
# Session 31 run 2 (right after run 1, on its warm machine; extra arguments go to bench_lm.py,
# --multi-row-fused when run 1's tests passed): (1) the byte-level LM's ES step beside batch
# inference (bench_lm.py, bf16, ranks 1 and 4, populations 16,384 to 262,144); (2) the one-row
# path: the ES step of EGGROLL's layer and EGGROLL's benchmark at ranks 1 and 4 (EGGROLL's
# code carried as .peers).
#   OUT=$OUT bash benchmarks/gpu_session31_run2.sh [--multi-row-fused]   (carry .peers)
source "$(dirname "$0")/_gpu_run_preamble.sh"
timeout 230 python3 benchmarks/bench_lm.py --dtype bfloat16 --ranks 1,4 \
  --pops 16384,65536,262144 --budget 200 --case-budget 15 --out "$OUT/lm_bfloat16" "$@" \
  > "$OUT/lm_bfloat16.log" 2>&1
echo "lm exit $?"
quiet "$OUT/lm_bfloat16.log" | grep -v '^{' | grep -v "^\[skip" | tail -10
timeout 120 python3 benchmarks/probe_es_step.py --skip-forms --floor \
  --only "bfloat16 evolution_strategy sgd (where|no check)$" --out "$OUT/es_step" \
  > "$OUT/es_step.log" 2>&1
echo "es step exit $?"
quiet "$OUT/es_step.log" | grep -E "inference|evolution_strategy" | head -8
timeout 200 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --skip "materialized|triton|ahead|stages" --budget 180 \
  --eggroll-path .peers --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
quiet "$OUT/bench.log" | grep -v '^{' | tail -24
