#!/bin/bash
# Session 9 (one H200): the ES transform's ways of dropping a non-finite generation
# (probe_es_step.py --skip-forms), SGD and Adam, bf16 and f32, kernel by kernel.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 300 python3 benchmarks/probe_es_step.py --skip-forms --out "$OUT" > "$OUT/probe_es_step.log" 2>&1
grep -v Warn "$OUT/probe_es_step.log"
