#!/usr/bin/env bash
# Session 5 on one H200, third call (about 4 minutes): the low-rank gradient's aligned K-major
# tile kernel against cuBLAS (config sweep, device busy time) and the ES step of EGGROLL's
# layer with tiles and with cuBLAS.   OUT=/dir bash benchmarks/gpu_session5_c.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
S="$OUT/summary.txt"
t0=$(date +%s)
timeout 110 python3 benchmarks/bench_low_rank_gradient.py --sweep --budget 95 --out "$R/grad" \
  > "$R/grad.txt" 2>&1
echo "== gradient exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
grep -v '^{"case' "$R/grad.txt" | grep -v -i warn | tail -16 | cut -c1-1200 >> "$S"
timeout 100 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|es step" --budget 85 --out "$R/bench" > "$R/bench.txt" 2>&1
echo "== es step exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
grep -E "^(inference|es step)" "$R/bench.txt" | awk '{$1=$1};1' | cut -c1-220 >> "$S"
tar czf "$OUT/r.tgz" -C "$R" . && rm -rf "$R"
