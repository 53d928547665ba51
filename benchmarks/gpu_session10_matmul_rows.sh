#!/bin/bash
# Ran at commit bcc376f; its multi-row fma kernel was dropped after, so check that commit
# out to run it again. Session 10 (one H200): the packed matmul's fma tiles with several
# rows of x sharing each weight's decode (t in float32 once, one multiply-add per row) at
# M = 2-16, against the 16-row dot tiles and a dense bf16 matmul; M = 1 against a frozen
# copy of session 9's kernels at today's heuristic (BEFORE, default before_matmul.py, run
# from a copy of the tree in .s10/, ignored by git). The compiled matmul checks first.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
BEFORE=${BEFORE:-before_matmul.py}
timeout 120 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 90 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 400 python3 benchmarks/bench_ternary.py --part matmul --batches 1,2,4,8,16 --budget 360 \
  --before-matmul "$BEFORE" --before-config heuristic --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | grep -v Warn | head -10
grep -v Warn "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-170 | head -120
