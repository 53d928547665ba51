#!/bin/bash
# Session 16 (one GPU), run 1: cases no GPU had compiled, and why the counter update with fewer
# instructions is slower in float32.
# 1. Antithetic pairs with per-individual x at batch 128-512 (two input tiles a pipeline
#    step), forward and VJP compiled against the reference (pytest, GPU-only test).
# 2. in = 4500 compiled against the reference; the gradient's lane accumulators timed
#    beside the default configs.
# 3. Nsight Compute on main's frozen counter update and the working tree's (centres re-read
#    for the tick), 8192^2 float32 and bfloat16: stall reasons per issued instruction and
#    memory traffic.
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
quiet() { grep -v Warn | grep -v _warn_once; }
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_virtual_noise_kernels.py \
  -k "large_batch" > "$OUT/pairs_large_batch.log" 2>&1; echo "pytest exit $?"
tail -4 "$OUT/pairs_large_batch.log"
timeout 120 python3 benchmarks/bench_virtual_noise.py --check --skip-noise-bits --only x4500 \
  --budget 100 --out "$OUT" --tag check_x4500 > "$OUT/check_x4500.log" 2>&1; echo "x4500 exit $?"
quiet < "$OUT/check_x4500.log" | grep -E "check|PASS|FAIL|rel_err" | cut -c1-160 | tail -8
timeout 150 python3 benchmarks/bench_virtual_noise.py --sweep --only "sweep gradient" \
  --budget 120 --out "$OUT" --tag sweep_gradient > "$OUT/sweep_gradient.log" 2>&1
echo "sweep exit $?"; quiet < "$OUT/sweep_gradient.log" | cut -c1-170 | tail -16
cat > /tmp/two_updates.py <<'PY'
import functools, sys
import jax, jax.numpy as jnp
sys.path.insert(0, "benchmarks")
import _harness
from jaxnoise.ops.ternary import pallas_triton_update, reference
frozen = _harness.frozen_module("benchmarks/baseline_update/update_7fbab3d.py")
shape = (8192, 8192)
codes = jax.random.randint(jax.random.key(0), shape, 0, reference.n_codes(11))
packed = reference.pack_codes_reference(codes)
scale = jnp.full((shape[0],), 0.5, jnp.float32)
v = jnp.full((shape[0],), 1.0, jnp.float32)
hyper = jnp.asarray([0.05, 1e-3, 0.99, 1e-8], jnp.float32)
seed = jnp.ones((1,), jnp.uint32)
for name, module in (("frozen", frozen), ("new", pallas_triton_update)):
  update = jax.jit(functools.partial(module.counter_update, C=11, lagged=False))
  for dtype in (jnp.float32, jnp.bfloat16):
    grad = jax.random.normal(jax.random.key(1), shape, dtype)
    jax.block_until_ready(update(packed, scale, v, grad, hyper, seed))
    print(name, jnp.dtype(dtype).name, flush=True)
PY
timeout 240 ncu --clock-control none -k regex:"ternary_counter_update" \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active" \
  python3 /tmp/two_updates.py > "$OUT/ncu_updates.txt" 2>&1; echo "ncu exit $?"
grep -E "^(frozen|new) |ternary_counter_update|Duration|Registers Per|Achieved Occupancy|dram__bytes|lts__t_bytes|inst_executed.sum|stalled" \
  "$OUT/ncu_updates.txt" | awk '$NF+0 > 0.05 || /ternary|Duration|Registers|Occupancy|bytes|inst_exec/' | cut -c1-120 | head -120
