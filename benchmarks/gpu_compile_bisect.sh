#!/usr/bin/env bash
# Issue 14 (compile time) in one GPU run, about 5 minutes on one H200:
# 1. compile_bisect.py: the old (transposed noise tile) and new forward kernels
#    at offsets 0 and 2**32 + 5, one factor at a time on the slow old kernel
#    (pipelining depth, tile size, ptxas -O0), XLA's stage timers, the runtime
#    of both tiles, a bit-exact check of the new one against the reference, and
#    the forward + VJP + gradient + reduce-metric module; each case in
#    its own process with a 40-s timeout.
# 2. compile_probe.py: every kernel variant at offsets 0, 2**32 + 5 and
#    2**40 + 3 with the new code (target: each first compile <= 5 s).
# Writes compile_bisect.{json,txt}, compile_probe.{json,txt} (and compile_ir.tar.gz
# if a probe case passes 5 s) under $OUT.
set -u
export OUT="${OUT:-benchmarks/out}"
mkdir -p "$OUT"
export PYTHONPATH="${PYTHONPATH:-}:."
python3 -c "import jax; print('jax', jax.__version__, jax.devices()[0].device_kind)" 2>&1 \
  | tee "$OUT/compile_bisect.txt"
timeout 210 python3 benchmarks/compile_bisect.py --timeout-s 40 2>&1 | tee -a "$OUT/compile_bisect.txt"
timeout 95 python3 benchmarks/compile_probe.py --budget-s 80 2>&1 | grep -v Warning \
  | tee "$OUT/compile_probe.txt"
# At most a few files come back: the probe's IR of any case over 5 s goes in one tarball.
if [ -d "$OUT/compile_ir" ]; then
  tar -czf "$OUT/compile_ir.tar.gz" -C "$OUT" compile_ir && rm -rf "$OUT/compile_ir"
fi
ls -la "$OUT"
