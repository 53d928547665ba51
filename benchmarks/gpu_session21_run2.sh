#!/bin/bash
# Session 21 (one H200), run 2: FromIOConfig.xla_gemm_rows with the dense kernel updating rows
# of the whole state in place (row_base): its compiled tests, then probe_from_io_blocks.py
# (fori / unrolled / transposed forms beside GEMM + update and the kernels' GEMM).
# cd .s21 && OUT=$OUT bash benchmarks/gpu_session21_run2.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 150 python3 -m pytest -q tests/test_ternary_ops.py \
  -k "gpu_counter_update or xla_gemm_row_blocks or row_base" \
  -p no:cacheprovider > "$OUT/tests.log" 2>&1; tail -3 "$OUT/tests.log"
timeout 240 python3 benchmarks/probe_from_io_blocks.py --out "$OUT" 2>&1 | quiet | tee "$OUT/probe.log"
