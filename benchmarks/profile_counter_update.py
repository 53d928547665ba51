"""One call each of the frozen 7fbab3d counter update and today's, for Nsight Compute.

8192x8192 codes, float32 then bfloat16 gradients; each call is compiled and
run once (the profiler replays the kernels). Run it under ``ncu -k
regex:ternary_counter_update``; the kernels come in the order printed.

    ncu --clock-control none -k regex:ternary_counter_update ... \\
        python3 benchmarks/profile_counter_update.py
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
from jaxnoise.ops.ternary import pallas_triton_update, reference  # noqa: E402

FROZEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "baseline_update",
                      "update_7fbab3d.py")


def run_updates(module, shape=(8192, 8192), label: str = ""):
  """One compiled call of ``module.counter_update`` per gradient dtype (float32, bfloat16)."""
  codes = jax.random.randint(jax.random.key(0), shape, 0, reference.n_codes(11))
  packed = reference.pack_codes_reference(codes)
  scale = jnp.full((shape[0],), 0.5, jnp.float32)
  v = jnp.full((shape[0],), 1.0, jnp.float32)
  hyper = jnp.asarray([0.05, 1e-3, 0.99, 1e-8], jnp.float32)
  seed = jnp.ones((1,), jnp.uint32)
  update = jax.jit(functools.partial(module.counter_update, C=11, lagged=False))
  for dtype in (jnp.float32, jnp.bfloat16):
    grad = jax.random.normal(jax.random.key(1), shape, dtype)
    jax.block_until_ready(update(packed, scale, v, grad, hyper, seed))
    print(label, jnp.dtype(dtype).name, flush=True)


def main():
  run_updates(_harness.frozen_module(FROZEN), label="frozen")
  run_updates(pallas_triton_update, label="new")


if __name__ == "__main__":
  main()
