#!/bin/bash
# Session 12 (one H200), run 6: the final code (SWAR population count only) compiled:
# test_low_rank.py's fused-path tests on the GPU.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_low_rank.py -k "fused or popcount" \
  > "$OUT/pytest.log" 2>&1
tail -3 "$OUT/pytest.log"
