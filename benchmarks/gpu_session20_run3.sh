#!/bin/bash
# Session 20 (one H200), run 3: the ES step of EGGROLL's layer (bf16 and f32, SGD) through
# evolution_strategy with and without the check, after the barrier and seal after XLA's GEMM
# were dropped, beside the hand-written step and twice inference; then virtual_weight_update
# per gradient config against the gradient and then the step (explore_gradient_update.py --ops).
# cd .s20 && OUT=$OUT bash benchmarks/gpu_session20_run3.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
quiet() { grep -v Warn | grep -v _warn_once; }
for dt in bfloat16 float32; do
timeout 150 python3 benchmarks/probe_es_step.py --floor --only "$dt (ranks donated$|evolution_strategy sgd$)" \
  --out $OUT/es_$dt 2>&1 | quiet | grep -E "inference|ranks|evolution|^    " | cut -c1-150 | tee $OUT/es_$dt.log
timeout 100 python3 benchmarks/probe_es_step.py --skip-forms --only "$dt evolution_strategy sgd no check$" \
  --out $OUT/es_nocheck_$dt 2>&1 | quiet | grep -E "evolution|^    " | cut -c1-150 | tee $OUT/es_nocheck_$dt.log
done
timeout 200 python3 benchmarks/explore_gradient_update.py --ops --out $OUT/ops 2>&1 | quiet > $OUT/ops.log; tail -9 $OUT/ops.log
