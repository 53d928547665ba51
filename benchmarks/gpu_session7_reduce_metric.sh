#!/bin/bash
# Session 7 (one H200): the reduce-metric "individuals" kernel with unmasked whole tiles,
# against pure JAX and beside session 6's kernel (a frozen copy, carried as
# .before/virtual_noise_pallas_triton_s6.py = git show c3aca90:jaxnoise/ops/virtual_noise/pallas_triton.py),
# default kind, the three SPEC shapes; then the compiled check of the reduce-metric kernels.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONPATH=.
mkdir -p "$OUT"
OUT=$OUT timeout 330 python3 benchmarks/bench_reduce_metric.py --kinds binomial \
  --before .before/virtual_noise_pallas_triton_s6.py > "$OUT/reduce_metric.log" 2>&1
timeout 150 python3 benchmarks/bench_virtual_noise.py --check --skip-noise-bits --skip-linear \
  --only "flat ops" --out "$OUT/check" > "$OUT/check.log" 2>&1
cat "$OUT/reduce_metric.log" | cut -c1-200
tail -20 "$OUT/check.log" | cut -c1-200
