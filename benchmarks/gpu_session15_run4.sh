#!/bin/bash
# Session 15 (one GPU), run 4: Nsight Compute on main's frozen counter update and the new one
# (8192^2, float32 and bfloat16 gradients): registers, occupancy, issue and stalls. Run 2 found
# the new kernel 12% slower in float32 with 21% fewer SASS instructions; is it occupancy?
set -u
OUT=${OUT:-benchmarks/out}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONPATH=.
mkdir -p "$OUT"
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
timeout 200 ncu --clock-control none -k regex:"ternary_counter_update" \
  --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
  --section Occupancy --section LaunchStats --section InstructionStats \
  python3 /tmp/two_updates.py > "$OUT/ncu_updates.txt" 2>&1; echo "ncu exit $?"
grep -E "^(frozen|new) |Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Block Limit Reg|Warp Cycles Per Issued|Issued Ipc|No Eligible|Executed Instructions  |Block Size|Dynamic Shared" \
  "$OUT/ncu_updates.txt" | cut -c1-120 | head -80
