#!/bin/bash
# Session 6 (one H200): the packed matmul with lane-ordered x, compiled against the reference
# (check part, matmul cases), then swept in device time beside the dense bf16 matmul (one
# weight copy per call) and the session-5 kernels at their session-5 heuristics (a frozen
# copy, carried as .before/pallas_triton_matmul_s5.py). Each run's commit is in RESULTS.md.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONPATH=.
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > "$OUT/gpu.txt" 2>&1
timeout 100 python3 benchmarks/bench_ternary.py --part check --only matmul --budget 70 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
timeout 450 python3 benchmarks/bench_ternary.py --part matmul --budget 400 \
  --before-matmul .before/pallas_triton_matmul_s5.py --out "$OUT/matmul" > "$OUT/matmul.log" 2>&1
grep -c "ok True" "$OUT/check.log"; grep -v "ok True" "$OUT/check.log" | head -20
grep "bf16_matmul\|before\|error" "$OUT/matmul.log" | sed 's/  */ /g' | cut -c1-200 | head -40
