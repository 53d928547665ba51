#!/bin/bash
# Session 8 (one H200): one ES step of EGGROLL's layer kernel by kernel (probe_es_step.py),
# with XLA's thunk sequences, to find the 0.038 ms "Memcpy DtoD" of session 4's steps.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
XLA_FLAGS="--xla_dump_to=/tmp/xla_dump" timeout 300 python3 benchmarks/probe_es_step.py \
  --out "$OUT" > "$OUT/probe_es_step.log" 2>&1
cat "$OUT/probe_es_step.log" | grep -v Warn
# Every copy or memcpy thunk XLA planned, per module.
grep -il "copy\|memcpy" /tmp/xla_dump/*thunk_sequence* 2>/dev/null | head -20
grep -iH "kCopy\|memcpy\|copy" /tmp/xla_dump/*jit_step*thunk_sequence* 2>/dev/null | cut -c1-220 | head -40
ls /tmp/xla_dump | grep jit_step | head -30
tar czf "$OUT/xla_step.tgz" -C /tmp/xla_dump $(cd /tmp/xla_dump && ls | grep -E "jit_step.*(after_optimizations.txt|thunk)" ) 2>/dev/null
