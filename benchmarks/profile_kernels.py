"""Run the main virtual-noise kernels once each, for Nsight Compute.

    XLA_PYTHON_CLIENT_PREALLOCATE=false ncu --clock-control none -k regex:virtual \\
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats \\
        python3 benchmarks/profile_kernels.py

Turn preallocation off: ncu saves and restores device memory around every replay pass, and
JAX otherwise holds most of the GPU.
"""

import jax
import jax.numpy as jnp

import jaxnoise


def main():
  pop, batch, out_features, in_features = 1024, 64, 256, 768
  x = jax.random.normal(jax.random.key(0), (batch, in_features), jnp.bfloat16)
  weight = jax.random.normal(jax.random.key(1), (out_features, in_features), jnp.bfloat16)
  seeds = jaxnoise.draw_seeds(jax.random.key(2), pop)
  for kind in ("rademacher", "uniform"):
    jax.block_until_ready(jaxnoise.virtual_perturbed_linear(x, weight, None, seeds, 0.01,
                                                            kind=kind))
  fitness = jax.random.normal(jax.random.key(3), (pop,))
  jax.block_until_ready(jaxnoise.virtual_weight_gradient(fitness, seeds, (1024, 1024), 0.1,
                                                         kind="rademacher"))


if __name__ == "__main__":
  main()
