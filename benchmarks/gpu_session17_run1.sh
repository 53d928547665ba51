#!/bin/bash
# Session 17 (one GPU), run 1, on the tree of commit 08af7c5 (bench_hash_pipes.py and the
# multiply-high hash were removed after it): the kernels' hash with multiply-high shifts
# (inline PTX), and the reduce-metric with whole tiles unmasked and a fused multiply-add.
# 1. The virtual-noise kernel tests compiled (the inline PTX exists only there).
# 2. bench_hash_pipes.py: every op with the shift hash and the multiply-high hash, bit for bit
#    equal, device time side by side.
# 3. bench_reduce_metric.py against pure JAX, with session 16's kernel module frozen beside it
#    (.before/virtual_noise_pallas_triton_4cc70a8.py = git show 4cc70a8:jaxnoise/ops/...).
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 200 python3 -m pytest -q -p no:cacheprovider -x tests/test_virtual_noise_kernels.py \
  > "$OUT/kernel_tests.log" 2>&1; echo "pytest exit $?"
tail -4 "$OUT/kernel_tests.log"
timeout 220 python3 benchmarks/bench_hash_pipes.py --budget 190 --out "$OUT" \
  > "$OUT/hash_pipes.log" 2>&1; echo "hash_pipes exit $?"
quiet < "$OUT/hash_pipes.log" | grep -v '^{' | tail -20
OUT=$OUT timeout 150 python3 benchmarks/bench_reduce_metric.py --kinds binomial \
  --before .before/virtual_noise_pallas_triton_4cc70a8.py 2>&1 | quiet | cut -c1-150
