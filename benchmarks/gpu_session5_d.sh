#!/usr/bin/env bash
# Session 5 on one H200, fourth call (about 3 minutes): the ES step of EGGROLL's layer with the
# fixed-order tiles and with cuBLAS (no barrier: the update may fuse into the GEMM), then the
# compiled low-rank kernels (aligned tiles) against the reference.
#   OUT=/dir bash benchmarks/gpu_session5_d.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
S="$OUT/summary.txt"
t0=$(date +%s)
timeout 100 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|es step" --budget 85 --out "$R/bench" > "$R/bench.txt" 2>&1
echo "== es step exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
grep -E "^(inference|es step)" "$R/bench.txt" | awk '{$1=$1};1' | cut -c1-220 >> "$S"
timeout 70 python3 benchmarks/bench_low_rank.py --check --kinds binomial,rademacher,normal,uniform \
  --budget 55 --out "$R/check" > "$R/check.txt" 2>&1
echo "== check exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
echo "ok: $(grep -c '"ok": true' "$R/check.txt")  not ok: $(grep -c '"ok": false' "$R/check.txt")" >> "$S"
grep -E '"ok": false|"error"' "$R/check.txt" | head -5 | cut -c1-400 >> "$S"
grep -o '"case": "[^"]*"' "$R/check.txt" | sed 's/"case": //' | cut -c1-110 >> "$S"
tar czf "$OUT/r.tgz" -C "$R" . && rm -rf "$R"
