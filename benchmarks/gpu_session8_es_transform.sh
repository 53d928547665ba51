#!/bin/bash
# Session 8 (one H200): one generation of EGGROLL's layer through the library's
# evolution_strategy against the hand-written step (probe_es_step.py), kernel by kernel.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 200 python3 benchmarks/probe_es_step.py --out "$OUT" > "$OUT/probe_es_step.log" 2>&1
grep -v Warn "$OUT/probe_es_step.log"
