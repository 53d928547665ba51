#!/bin/bash
# Session 20 (one H200), run 4: the final code's compiled tests of the fused SGD step
# (virtual_weight_update, the ES transform without a barrier after XLA's GEMM), and the ES step
# with Adam, with and without the check (bf16).
# cd .s20 && OUT=$OUT bash benchmarks/gpu_session20_run4.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 200 python3 -m pytest -q tests/test_low_rank.py tests/test_optim_es.py \
  -k "weight_update or xla_gemm_estimate or config_tuple or hopper" -p no:cacheprovider \
  > "$OUT/tests.log" 2>&1; tail -3 "$OUT/tests.log"
timeout 150 python3 benchmarks/probe_es_step.py --skip-forms \
  --only "bfloat16 evolution_strategy adam (where|no check)$" --out "$OUT/es_adam" 2>&1 | quiet \
  | grep -E "evolution|^    " | cut -c1-150 | tee "$OUT/es_adam.log"
