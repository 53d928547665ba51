#!/bin/bash
# Session 21 (one H200), run 4: first-compile time of every kernel variant at offsets 0,
# 2**32 + 5 and 2**40 + 3 (compile_probe.py): the kernels added since session 4 first (the
# low-rank forward, fused and Triton, its VJP, the gradient, the SGD step; the packed matmul by
# rows, its input gradient, the decode; counter_update_from_io; the counter update), then
# session 4's full-rank set.
# cd .s21 && OUT=$OUT bash benchmarks/gpu_session21_run4.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/new" "$OUT/full_rank"
quiet() { grep -v Warn | grep -v _warn_once; }
OUT=$OUT/new timeout 330 python3 benchmarks/compile_probe.py --budget-s 300 \
  --only lr_fused_forward,lr_forward,lr_vjp,lr_gradient,lr_weight_update,ternary_matmul,ternary_input_grad,ternary_decode,from_io,counter_update \
  2>&1 | quiet | cut -c1-170 | tee "$OUT/new.log" | awk '/over 5 s|error/ || NR % 8 == 1'
OUT=$OUT/full_rank timeout 150 python3 benchmarks/compile_probe.py --budget-s 120 \
  --only forward,input_grad,gradient,reduce 2>&1 | quiet | cut -c1-170 | tee "$OUT/full_rank.log" \
  | awk '/over 5 s|error/ || NR % 8 == 1'
