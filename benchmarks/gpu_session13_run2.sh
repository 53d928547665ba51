#!/bin/bash
# Session 13 (one H200), run 2: the fused low-rank forward taking float32 x (TF32 wgmma) and
# chosen by default up to rank 4. Compiled: test_low_rank.py's fused-path tests and the float32
# fused checks; then EGGROLL's benchmark at ranks 1, 2, 4 in bf16 and f32 (binomial, rademacher):
# inference, EGGROLL's code, the library's default and the other path, in one run.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/check" "$OUT/bench"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log"
timeout 110 python3 benchmarks/bench_low_rank.py --check --only "float32" --budget 90 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
grep -v Warn "$OUT/check.log" | grep -v _warn_once | cut -c1-230 | tail -4
timeout 300 python3 benchmarks/bench_low_rank.py --bench --ranks 1,2,4 --kinds binomial,rademacher \
  --only "inference|jaxnoise|eggroll" --budget 280 \
  --eggroll-path ../.peers --out "$OUT/bench" > "$OUT/bench.log" 2>&1
grep -v Warn "$OUT/bench.log" | grep -v _warn_once | grep -v '^{' | cut -c1-150 | tail -40
