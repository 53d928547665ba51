#!/bin/bash
# Session 20 (one H200), run 2: the estimate's GEMM with the SGD step in its epilogue
# (explore_gradient_update.py: XLA's GEMM alone and with the step, Pallas Triton tiles with and
# without it), the hand-written ES step with virtual_weight_update per tiles beside XLA's
# (probe_es_step.py --update-tiles), and the compiled tests of virtual_weight_update.
# cd .s20 && OUT=$OUT bash benchmarks/gpu_session20_run2.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
quiet() { grep -v Warn | grep -v _warn_once; }
nvidia-smi --query-gpu=name,driver_version --format=csv > $OUT/gpu.txt 2>&1
timeout 240 python3 benchmarks/explore_gradient_update.py --out $OUT 2>&1 | quiet > $OUT/explore.log; tail -16 $OUT/explore.log
timeout 200 python3 benchmarks/probe_es_step.py --floor --only "bfloat16 (ranks donated|evolution_strategy sgd$)" \
  --update-tiles 128x256x64/8/3,128x128x64/4/4,256x128x64/8/3 --out $OUT/es 2>&1 | quiet \
  | grep -E "inference|ranks|evolution|^    " | cut -c1-150 | tee $OUT/es.log
timeout 120 python3 -m pytest -q tests/test_low_rank.py -k "weight_update" -p no:cacheprovider > $OUT/tests.log 2>&1; tail -3 $OUT/tests.log
