"""One call of the fused low-rank forward per case, for Nsight Compute (GPU).

EGGROLL's layer (1024 members, one row each, (8192, 8192), antithetic, no
bias). Each case is ``DTYPE:RANK`` (``bf16:4``, ``f32:1``); the default is
bf16 at ranks 1 and 4. Each case runs twice (compile and warm-up, then the
call to read), so under Nsight Compute read the second launch of each kernel:

    ncu --clock-control none --section WarpStateStats --section SourceCounters \\
        python3 benchmarks/profile_fused_forward.py bf16:1 bf16:4
"""

from __future__ import annotations

import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jaxnoise  # noqa: E402

DTYPES = {"bf16": jnp.bfloat16, "f32": jnp.float32}


def main(cases):
  pop, width = 1024, 8192
  for case in cases or ("bf16:1", "bf16:4"):
    dtype_name, _, rank = case.partition(":")
    dtype, rank = DTYPES[dtype_name], int(rank)
    x = jax.random.normal(jax.random.key(0), (pop, 1, width), dtype)
    weight = (jax.random.normal(jax.random.key(1), (width, width)) / width ** 0.5).astype(dtype)
    seeds = jnp.arange(pop, dtype=jnp.uint32) * 7 + 3
    call = jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, antithetic=True,
                                     rank=rank, out_dtype=dtype))
    if "mosaic_gpu" not in call.lower(x, weight, None, seeds, 0.01).as_text():
      raise SystemExit(f"case {case}: the fused Mosaic GPU forward is not taken here")
    print(f"case {case}", flush=True)
    for _ in range(2):
      jax.block_until_ready(call(x, weight, None, seeds, 0.01))


if __name__ == "__main__":
  main(sys.argv[1:])
