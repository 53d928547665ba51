#!/bin/bash
# Session 17 (one GPU), run 2 (run "1b"; .s17 had _pallas.MIX32_BY_MULTIPLY_HIGH = False): the
# reduce-metric with whole tiles and a fused multiply-add on the shift hash against session
# 16's frozen kernels, the ES step of EGGROLL's layer, the int4 GEMM reproducer.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
quiet() { grep -v Warn | grep -v _warn_once; }
OUT=$OUT timeout 150 python3 benchmarks/bench_reduce_metric.py --kinds binomial,uniform \
  --before .before/virtual_noise_pallas_triton_4cc70a8.py 2>&1 | quiet | grep -E "reduce-metric|individuals  |before|pure JAX " | cut -c1-150
timeout 100 python3 benchmarks/probe_es_step.py --skip-forms --only "sgd (where|no check)$" \
  --out "$OUT/es" 2>&1 | quiet | grep "evolution_strategy"
for flags in "" "--xla_gpu_autotune_level=0"; do
  echo "== XLA_FLAGS=$flags"
  XLA_FLAGS="$flags" timeout 60 python3 benchmarks/check_int4_gemm.py --repeats 1 2>&1 \
    | quiet | cut -c1-160 | tail -7
done
