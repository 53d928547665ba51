#!/bin/bash
# Session 13 (one H200), run 4: one ES step of EGGROLL's layer through evolution_strategy (SGD,
# with and without the finiteness check) with the default forward (now the fused one, bf16 and
# float32).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/es"
timeout 100 python3 benchmarks/probe_es_step.py --skip-forms --only "sgd (where|no check)$" \
  --out "$OUT/es" > "$OUT/es.log" 2>&1
grep -v Warn "$OUT/es.log" | grep -v _warn_once | head -40
