#!/bin/bash
# Session 17 (one GPU), run 4: the binomial reduce-metric on the unit 1 + popcount / 32 (13
# SASS instructions per value instead of 14) against commit 8e41f63's kernel module, frozen
# (.before/virtual_noise_pallas_triton_8e41f63.py = git show 8e41f63:jaxnoise/ops/...), at
# the heuristic config; every output against the reference (deviation above 1e-5: excluded).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
OUT=$OUT timeout 150 python3 benchmarks/bench_reduce_metric.py --kinds binomial \
  --configs individuals --before .before/virtual_noise_pallas_triton_8e41f63.py 2>&1 \
  | grep -v Warn | grep -v _warn_once | cut -c1-150
