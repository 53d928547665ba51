#!/bin/bash
# Session 19 (one H200), run 3: one ES step of EGGROLL's layer through evolution_strategy (bf16,
# SGD, rank 1, with the default finiteness check and without) against twice batch inference in
# the same run, then the step again with XLA's Triton GEMMs off (the estimate's GEMM through
# cuBLAS); then the packed matmul at 1-2 rows with small programs beside the heuristic.
# cd .s19 && OUT=$OUT bash benchmarks/gpu_session19_run3.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 75 python3 benchmarks/probe_es_step.py --skip-forms --floor \
  --only "bfloat16 evolution_strategy sgd (where|no check)$" --out "$OUT/es" 2>&1 | quiet \
  | grep -E "inference|evolution_strategy|^    " | cut -c1-150 | tee "$OUT/es.log"
XLA_FLAGS=--xla_gpu_enable_triton_gemm=false timeout 45 python3 benchmarks/probe_es_step.py \
  --skip-forms --only "bfloat16 evolution_strategy sgd where$" --out "$OUT/es_cublas" 2>&1 \
  | quiet | grep -E "evolution_strategy|^    " | cut -c1-150 | tee "$OUT/es_cublas.log"
timeout 100 python3 benchmarks/bench_ternary.py --part matmul --batches 1,2 --budget 75 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-170 | head -60
