#!/bin/bash
# Session 29 run 2 (one H200 wanted; H100 otherwise): issue 9's targets on the current tree.
# (1) The ES step of EGGROLL's layer (bf16, rank 1, SGD, XLA's GEMM for the estimate, with and
# without the finiteness check) against inference plus one GEMM; (2) EGGROLL's benchmark at
# ranks 1, 2, 4, 8, 16 (binomial, bf16 and f32) with EGGROLL's code (carried as .peers) and
# the plot.
#   OUT=$OUT bash benchmarks/gpu_session29_run2.sh
source "$(dirname "$0")/_gpu_run_preamble.sh"
timeout 150 python3 benchmarks/probe_es_step.py --skip-forms --floor \
  --only "bfloat16 evolution_strategy sgd (where|no check)$" --out "$OUT/es_step" \
  > "$OUT/es_step.log" 2>&1
echo "es step exit $?"
quiet "$OUT/es_step.log" | grep -E "inference|evolution_strategy" | head -8
timeout 400 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4,8,16 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --skip "materialized|triton|ahead|stages" --budget 370 \
  --eggroll-path .peers --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench exit $?"
quiet "$OUT/bench.log" | grep -v '^{' | tail -40
