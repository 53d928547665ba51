#!/bin/bash
# Ran at commit f8e22d6 (run 1 with its first sweep list); the options it measured were
# removed after (no gain), so check that commit out to run it again.
# Session 8 run 2 (one H200): 16-row dot tiles reading x in 16-byte vectors from x itself (no
# XLA transpose; MatmulConfig.x_vector_loads) against session 7's lane-major x, and the best
# prefetching fma tiles of run 1 again; the matmul cases of the compiled check first.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 100 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 70 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 300 python3 benchmarks/bench_ternary.py --part matmul --batches 1,4,16 --budget 260 \
  --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | head -10
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g;s/MatmulConfig//' | cut -c1-170 | head -90
