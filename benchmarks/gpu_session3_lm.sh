#!/usr/bin/env bash
# The 2026-11-30 language-model run on one H200: the LM ES-step benchmark, then the
# example (low-rank ES beside Adam). Results in $OUT/results_lm.tgz plus the curve.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
export CUDA_VISIBLE_DEVICES=0
R="$OUT/r"; mkdir -p "$R"
timeout 140 python3 benchmarks/bench_lm.py --budget 100 --out "$R/lm_bench" > "$R/lm_bench.txt" 2>&1
grep -v '^{' "$R/lm_bench.txt" | tail -14 | cut -c1-220
timeout 200 python3 examples/es_language_model.py --time-budget 55 --out runs/es_language_model > "$R/es_language_model.log" 2>&1
tail -12 "$R/es_language_model.log" | cut -c1-220
cp runs/es_language_model/curve.png "$OUT/lm_curve.png" 2>/dev/null
cp runs/es_language_model/samples.txt "$R/" 2>/dev/null
tar czf "$OUT/results_lm.tgz" -C "$R" .
