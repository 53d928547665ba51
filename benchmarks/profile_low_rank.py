"""Run the low-rank forward's kernels once each, for Nsight Compute (GPU).

    XLA_PYTHON_CLIENT_PREALLOCATE=false ncu --clock-control none \\
        -k regex:"low_rank|explore|gemm|nvjet|xmma" --section SpeedOfLight \\
        --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \\
        python3 benchmarks/profile_low_rank.py

EOGGROLL's benchmark shape (1024 members x one row, (8192, 8192), antithetic,
bf16): the library's kernel path at ranks 1 and 4, and the prototypes of
``explore_low_rank_gemm.py`` (the ``x_i B_i`` kernel, the Pallas GEMM with the
low-rank epilogue).
"""

import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import explore_low_rank_gemm as explore  # noqa: E402
import jaxnoise  # noqa: E402


def main():
  pop, d = 1024, 8192
  x3 = jax.random.normal(jax.random.key(0), (pop, 1, d), jnp.bfloat16)
  x = x3[:, 0]
  w = (jax.random.normal(jax.random.key(1), (d, d), jnp.float32) / d ** 0.5).astype(jnp.bfloat16)
  seeds = jnp.arange(pop, dtype=jnp.uint32) * 7 + 3
  for rank in (1, 4):
    fn = jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, antithetic=True,
                                   rank=rank, out_dtype=jnp.bfloat16))
    jax.block_until_ready(fn(x3, w, None, seeds, 0.01))
    args = dict(rank=rank, kind="binomial", offset=0, out_features=d, in_features=d)
    xb, row_seeds = jax.block_until_ready(jax.jit(functools.partial(explore.xb_kernel, **args))(
        x, seeds, 0.01))
    gemm = jax.jit(functools.partial(explore.pallas_gemm, bm=128, bn=256, bk=64, warps=8,
                                     stages=3, rank=rank, kind="binomial"))
    jax.block_until_ready(gemm(x, w, xb, row_seeds))


if __name__ == "__main__":
  main()
