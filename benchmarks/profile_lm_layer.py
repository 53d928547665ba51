"""One LM layer's GEMMs for Nsight Compute: XLA's ``x @ kernel`` and the fused low-rank GEMM.

``probe_lm_layers.py`` times the LM's layers in device time through CUPTI, which
Nsight Compute cannot share. This script only runs them: the XLA floor
(``x @ kernel`` as ``nnx.Linear`` computes it) twice, then
:func:`jaxnoise.virtual_perturbed_linear` with the heuristic config twice, on
16,384 members of 64 rows in antithetic pairs (bf16, "binomial"), so a profiler
filtered on ``nvjet|mosaic`` sees two launches of each:

    ncu -k regex:"nvjet|mosaic" --section SpeedOfLight \\
        python3 benchmarks/profile_lm_layer.py --shape 512x512 --rank 1
    python3 benchmarks/profile_lm_layer.py --quick   # tiny shapes, interpreter (CPU check)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jaxnoise  # noqa: E402


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--shape", default="512x512", help="in x out")
  parser.add_argument("--rank", type=int, default=1)
  parser.add_argument("--pop", type=int, default=16384)
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--quick", action="store_true", help="tiny shapes, interpreter (CPU)")
  parser.add_argument("--out", default="", help="folder for lm_layer_profile.json (optional)")
  args = parser.parse_args(argv)
  n_in, n_out = (int(v) for v in args.shape.split("x"))
  pop, rows = (4, 64) if args.quick else (args.pop, args.rows)
  if args.quick:
    n_in, n_out = 64, 256
  implementation = "pallas" if jax.default_backend() == "gpu" else "interpret"
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(pop, rows, n_in)), jnp.bfloat16)
  weight = jnp.asarray(rng.normal(size=(n_out, n_in)) / np.sqrt(n_in), jnp.bfloat16)
  kernel = jnp.asarray(weight.T)
  seeds = jnp.asarray(np.repeat(rng.integers(0, 2**32, size=pop // 2, dtype=np.uint32), 2))
  floor = jax.jit(lambda x, kernel: x @ kernel)
  fused = jax.jit(lambda x: jaxnoise.virtual_perturbed_linear(
      x, weight, None, seeds, 0.01, 12345, kind="binomial", antithetic=True, rank=args.rank,
      out_dtype=jnp.bfloat16, implementation=implementation))
  for _ in range(2):
    floor(x, kernel).block_until_ready()
  for _ in range(2):
    y = fused(x).block_until_ready()
  record = dict(shape=f"{n_in}x{n_out}", rank=args.rank, pop=pop, rows=rows,
                output=list(y.shape), finite=bool(jnp.isfinite(y.astype(jnp.float32)).all()))
  print(record)
  if args.out:
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "lm_layer_profile.json"), "w") as f:
      json.dump(record, f)
  return 0


if __name__ == "__main__":
  sys.exit(main())
