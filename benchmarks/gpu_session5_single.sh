#!/usr/bin/env bash
# Session 5 on one H200 (about 9 minutes): the low-rank gradient's tile kernel against
# cuBLAS with a config sweep (device busy time), the ES step of EGGROLL's layer with it,
# the compiled low-rank kernels against the reference (weight gradient included), then
# the ternary parts (issue 14).   OUT=/dir bash benchmarks/gpu_session5_single.sh
set -u
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH="${PYTHONPATH:-}:."
R="$OUT/r"; mkdir -p "$R"
S="$OUT/summary.txt"
{ nvidia-smi -L; python3 -c "import jax; print('jax', jax.__version__)"; } > "$S" 2>&1
t0=$(date +%s)
timeout 110 python3 benchmarks/bench_low_rank_gradient.py --sweep --budget 90 --out "$R/grad" \
  > "$R/grad.txt" 2>&1
echo "== gradient exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
grep -v '^{"case' "$R/grad.txt" | grep -v -i warn | tail -16 | cut -c1-900 >> "$S"
timeout 100 python3 benchmarks/bench_low_rank.py --bench --ranks 1,4 --kinds binomial \
  --only "inference|es step" --budget 80 --out "$R/bench" > "$R/bench.txt" 2>&1
echo "== es step exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
grep -E "^(inference|es step)" "$R/bench.txt" | awk '{$1=$1};1' | cut -c1-220 >> "$S"
timeout 60 python3 benchmarks/bench_low_rank.py --check --kinds binomial,rademacher,normal \
  --ranks 1,3 --budget 45 --out "$R/check" > "$R/check.txt" 2>&1
echo "== check exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
grep -E '"ok"' "$R/check.txt" | grep -c '"ok": true' >> "$S"
grep -E '"ok": false|error' "$R/check.txt" | head -5 | cut -c1-400 >> "$S"
mkdir -p "$OUT/ternary"
OUT="$OUT/ternary" timeout 300 bash benchmarks/gpu_session4_ternary.sh > /dev/null 2>&1
echo "== ternary exit $? at $(( $(date +%s) - t0 )) s" >> "$S"
tar czf "$OUT/r.tgz" -C "$R" . && rm -rf "$R"
