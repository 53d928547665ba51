#!/usr/bin/env bash
# The 2026-11-30 single-H200 run: low-rank bench and checks, then issue 14's script.
# Everything lands in $OUT/results.tgz (the device returns at most 8 files).
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
nvidia-smi -L; python3 -c "import jax; print(jax.__version__, jax.devices())"
timeout 230 python3 benchmarks/bench_low_rank.py --bench --out "$R" --budget 200 > "$R/bench_log.txt" 2>&1
grep -v '^{' "$R/bench_log.txt" | grep -E "^(inference|eggroll|jaxnoise|es step)|cases" | cut -c1-44,150-230
grep '"breakdown' "$R/bench_log.txt" | cut -c1-900
mkdir -p "$R/check"
timeout 100 python3 benchmarks/bench_low_rank.py --check --out "$R/check" --budget 80 > "$R/check_log.txt" 2>&1
grep -E '"error"|cases' "$R/check_log.txt" | cut -c1-300 | tail -5
OUT="$R/i14" bash benchmarks/gpu_issue14.sh > "$R/i14_log.txt" 2>&1
tail -40 "$R/i14_log.txt" | cut -c1-200
cp "$R/low_rank.png" "$OUT/" 2>/dev/null
tar czf "$OUT/results.tgz" -C "$R" .
rm -rf "$R"
