#!/bin/bash
# Session 16 (one GPU), run 5: XLA's int4 GEMM in pure JAX (benchmarks/check_int4_gemm.py),
# with the default autotuning and without.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
for flags in "" "--xla_gpu_autotune_level=0"; do
  echo "== XLA_FLAGS=$flags"
  XLA_FLAGS="$flags" timeout 45 python3 benchmarks/check_int4_gemm.py --repeats 1 2>&1 \
    | grep -v Warn | cut -c1-160 | tail -7
done
