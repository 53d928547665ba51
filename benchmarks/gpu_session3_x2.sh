#!/usr/bin/env bash
# The 2026-11-30 two-H200 run: scaling (1 vs 2 GPUs, one process; then one process per GPU)
# and every noise kind's throughput on GPU 0. Results in $OUT/results_x2.tgz.
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
nvidia-smi -L
timeout 215 python3 benchmarks/bench_scaling.py --budget 150 --big-one-gb 20 --out "$R/scaling" > "$R/scaling.txt" 2>&1
grep -v '^{' "$R/scaling.txt" | tail -25 | cut -c1-220
CUDA_VISIBLE_DEVICES=0 timeout 75 python3 benchmarks/bench_virtual_noise.py --throughput --budget 55 --out "$R/kinds" > "$R/kinds.txt" 2>&1
grep -E "values|throughput" "$R/kinds.txt" | grep -v '^{' | tail -14 | cut -c1-200
grep -c '"error"' "$R/kinds.txt"
timeout 95 python3 benchmarks/bench_scaling.py --processes 2 --big-one-gb 0 --pops 65536 --budget 60 --out "$R/scaling_mp" > "$R/scaling_mp.txt" 2>&1
grep -v '^{' "$R/scaling_mp.txt" | tail -12 | cut -c1-220
tar czf "$OUT/results_x2.tgz" -C "$R" .
