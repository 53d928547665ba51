#!/bin/bash
# Session 24 run 3 (one H100 or H200): issue 9's figures on this card. EGGROLL's benchmark
# (1024 members x 8192^2, one input row each) at ranks 1 and 4, binomial, bf16 and f32,
# beside EGGROLL's code (carried as ../.peers/hyperscalees_noiser, never committed); then one
# ES step of that layer through evolution_strategy (SGD, rank 1, bf16) with and without the
# finiteness check, against inference plus one GEMM of the layer.
source "$(dirname "$0")/_gpu_run_preamble.sh"
timeout 200 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|jaxnoise|eggroll" --skip "materialized|step|triton" --budget 170 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
quiet "$OUT/bench.log" | grep -v '^{' | tail -24
timeout 90 python3 benchmarks/probe_es_step.py --skip-forms --floor \
  --only "bfloat16 evolution_strategy sgd (where|no check)$" --out "$OUT/es" > "$OUT/es.log" 2>&1
quiet "$OUT/es.log" | grep -E "inference|evolution_strategy|^    " | head -30
