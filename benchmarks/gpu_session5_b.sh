#!/usr/bin/env bash
# Session 5 on one H200, second call (about 9 minutes): the low-rank gradient's K-major tile
# kernel against cuBLAS with the config sweep, the ES step at rank 1, then the ternary
# parts (gpu_session5_ternary.sh).   OUT=/dir bash benchmarks/gpu_session5_b.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
S="$OUT/summary.txt"
t0=$(date +%s)
timeout 85 python3 benchmarks/bench_low_rank_gradient.py --sweep --budget 70 --out "$R/grad" \
  > "$R/grad.txt" 2>&1
echo "== gradient exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
grep -v '^{"case' "$R/grad.txt" | grep -v -i warn | tail -16 | cut -c1-900 >> "$S"
timeout 70 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|es step" --budget 55 --out "$R/bench" > "$R/bench.txt" 2>&1
echo "== es step exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
grep -E "^(inference|es step)" "$R/bench.txt" | awk '{$1=$1};1' | cut -c1-220 >> "$S"
mkdir -p "$OUT/ternary"
OUT="$OUT/ternary" timeout 410 bash benchmarks/gpu_session5_ternary.sh > /dev/null 2>&1
echo "== ternary exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
tar czf "$OUT/r.tgz" -C "$R" . && rm -rf "$R"
