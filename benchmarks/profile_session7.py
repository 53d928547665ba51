"""Run the counter update and the reduce-metric once each, for Nsight Compute (session 7).

    XLA_PYTHON_CLIENT_PREALLOCATE=false ncu --clock-control none \\
        -k regex:"ternary_counter_update|virtual_reduce_metric" \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section Occupancy --section LaunchStats --section InstructionStats \\
        python3 benchmarks/profile_session7.py

The counter update at 8192x8192 in float32 and bfloat16 (its heuristic config), and the
reduce-metric at 1024 x 2**20 with the default kind (``benchmarks/gpu_session7_profile.sh``).
"""

import functools

import jax
import jax.numpy as jnp

import jaxnoise
from jaxnoise.ops.ternary import pallas_triton_update
from jaxnoise.ops.ternary import reference


def main():
  shape = (8192, 8192)
  codes = jax.random.randint(jax.random.key(0), shape, 0, reference.n_codes(11))
  packed = reference.pack_codes_reference(codes)
  scale = jnp.full((shape[0],), 0.5, jnp.float32)
  v = jnp.full((shape[0],), 1.0, jnp.float32)
  hyper = jnp.asarray([0.05, 1e-3, 0.99, 1e-8], jnp.float32)
  seed = jnp.ones((1,), jnp.uint32)
  update = jax.jit(functools.partial(pallas_triton_update.counter_update, C=11, lagged=False))
  for dtype in (jnp.float32, jnp.bfloat16):
    grad = jax.random.normal(jax.random.key(1), shape, dtype)
    jax.block_until_ready(update(packed, scale, v, grad, hyper, seed))
  center = jax.random.normal(jax.random.key(2), (1 << 20,), jnp.float32)
  seeds = jnp.arange(1024, dtype=jnp.uint32)
  jax.block_until_ready(jaxnoise.virtual_reduce_metric(center, seeds, 0.1))


if __name__ == "__main__":
  main()
