#!/bin/bash
# Session 13 (one H200), run 1: the fused low-rank forward over several tiles of pairs, compiled:
# test_low_rank.py's fused-path tests (the GPU test has 3 tiles of 64 pairs) and
# bench_low_rank.py's fused checks (up to 3 tiles of pairs, and EGGROLL's 1024-member layer).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT/check"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log"
timeout 330 python3 benchmarks/bench_low_rank.py --check --only "fused check" --budget 310 \
  --out "$OUT/check" > "$OUT/check.log" 2>&1
grep -v Warn "$OUT/check.log" | grep -v _warn_once | cut -c1-230 | tail -22
