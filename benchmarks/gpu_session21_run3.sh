#!/bin/bash
# Session 21 (one H200), run 3: the row blocks with the whole state's skipped flags aliased and
# the block index as the kernel's operand (no per-block concatenation or update-slice): the
# compiled tests, probe_from_io_blocks.py (blocks of 512 / 1024 / 2048 rows), and the from_io part
# of bench_ternary.py (the heuristic and the row blocks through the public config).
# cd .s21 && OUT=$OUT bash benchmarks/gpu_session21_run3.sh
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 150 python3 -m pytest -q tests/test_ternary_ops.py \
  -k "gpu_counter_update or xla_gemm_row_blocks or row_block" \
  -p no:cacheprovider > "$OUT/tests.log" 2>&1; tail -3 "$OUT/tests.log"
timeout 150 python3 benchmarks/probe_from_io_blocks.py --out "$OUT" 2>&1 | quiet | tee "$OUT/probe.log"
