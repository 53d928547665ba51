"""Run the counter update and the reduce-metric (or the packed matmul) once each, for Nsight Compute.

    XLA_PYTHON_CLIENT_PREALLOCATE=false ncu --clock-control none \\
        -k regex:"ternary_counter_update|virtual_reduce_metric" \\
        --section SpeedOfLight --section WarpStateStats --section SchedulerStats \\
        --section Occupancy --section LaunchStats --section InstructionStats \\
        python3 benchmarks/profile_session7.py

The counter update at 8192x8192 in float32 and bfloat16 (its heuristic config), and the
reduce-metric at 1024 x 2**20 with the default kind (``benchmarks/gpu_session7_profile.sh``).
With ``matmul [M]``: the packed matmul at ``M`` rows (default 1) of bf16, 4096^2 and
8192^2 (its heuristic tiles), under ``-k regex:ternary_matmul``.
"""

import functools
import sys

import jax
import jax.numpy as jnp

import jaxnoise
import profile_counter_update  # pylint: disable=g-bad-import-order
from jaxnoise.ops.ternary import pallas_triton_matmul
from jaxnoise.ops.ternary import pallas_triton_update
from jaxnoise.ops.ternary import reference


def matmul(m_rows: int = 1):
  for n in (4096, 8192):
    codes = jax.random.randint(jax.random.key(0), (n, n), 0, reference.n_codes(11))
    packed = reference.pack_codes_reference(codes)
    scale = jnp.full((n,), 0.5, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (m_rows, n), jnp.bfloat16)
    call = jax.jit(functools.partial(pallas_triton_matmul.ternary_matmul, C=11,
                                     out_dtype=jnp.bfloat16))
    jax.block_until_ready(call(x, packed, scale))


def main():
  if sys.argv[1:2] == ["matmul"]:
    matmul(*(int(m) for m in sys.argv[2:3]))
    return
  profile_counter_update.run_updates(pallas_triton_update)
  center = jax.random.normal(jax.random.key(2), (1 << 20,), jnp.float32)
  seeds = jnp.arange(1024, dtype=jnp.uint32)
  jax.block_until_ready(jaxnoise.virtual_reduce_metric(center, seeds, 0.1))


if __name__ == "__main__":
  main()
