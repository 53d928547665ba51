#!/bin/bash
# Session 14 (one H200), run 1: the fused low-rank forward with four pipeline stages (64-byte
# output chunks) compiled against the reference, its operands kernel and GEMM configs swept
# (EGGROLL's layer, bf16 and f32), and one ES step of that layer with the fused default.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/es"
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest_fused.log" 2>&1
tail -3 "$OUT/pytest_fused.log"
timeout 290 python3 benchmarks/tune_low_rank.py --path fused --budget 230 --out "$OUT" \
  > "$OUT/tune_fused.log" 2>&1
grep -v Warn "$OUT/tune_fused.log" | grep -v _warn_once | cut -c1-400 | tail -60
timeout 100 python3 benchmarks/probe_es_step.py --skip-forms --only "sgd (where|no check)$" \
  --out "$OUT/es" > "$OUT/es.log" 2>&1
grep -v Warn "$OUT/es.log" | grep -v _warn_once | head -30
