"""One compiled call of the packed matmul per case, for Nsight Compute.

M = 1 and 2 rows of bfloat16 ``x`` at 4096^2 and 8192^2 with the heuristic's
tiles; run it under ``ncu -k regex:ternary_matmul`` (the kernels come in the
order printed).

    ncu --clock-control none -k regex:ternary_matmul --section SpeedOfLight \\
        --section ComputeWorkloadAnalysis --section WarpStateStats \\
        python3 benchmarks/profile_matmul.py
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from jaxnoise.ops.ternary import pallas_triton_matmul, reference  # noqa: E402

CASES = [(1, 4096, 4096), (1, 8192, 8192), (2, 8192, 8192)]


def main():
  for m_rows, out_features, in_features in CASES:
    codes = jax.random.randint(jax.random.key(0), (out_features, in_features), 0,
                               reference.n_codes(11))
    packed = reference.pack_codes_reference(codes)
    scale = jnp.full((out_features,), 0.5, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (m_rows, in_features), jnp.bfloat16)
    call = jax.jit(functools.partial(pallas_triton_matmul.ternary_matmul, C=11,
                                     out_dtype=jnp.bfloat16))
    print(f"case M={m_rows} {out_features}x{in_features}", flush=True)
    call(x, packed, scale).block_until_ready()


if __name__ == "__main__":
  main()
