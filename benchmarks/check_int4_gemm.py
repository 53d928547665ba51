"""XLA's GEMM with an int4 operand against the same GEMM on bfloat16, in pure JAX.

Until 2026-12-03 the packed matmul's decode method could hand XLA ``t`` (-1,
0, +1) as int4 nibbles, which XLA converts inside its GEMM. On an H200 (jax
0.11.2) that GEMM gave wrong values (session 16, run 4, the library's path):
with XLA's default autotuning, the input gradient ``g t`` at
``(21, 19, 44)`` had every odd column off; with ``--xla_gpu_autotune_level=0``
the forward ``x t^T`` was wrong at every shape tried and the input gradient
at 21x19x44 and 64x4096x4096. The decode now writes the compute dtype only.

This script builds the same operands without the library: ``t`` as int4 (an
``optimization_barrier`` keeps the conversion out of the producer, as the
library did) meets ``x`` (``x t^T``) and ``g`` (``g t``) in one XLA GEMM, and
is compared with ``t`` as bfloat16 (exact) in the same GEMM. Run it under
several ``XLA_FLAGS``; it prints the columns that differ. This pure-JAX form
has not run on a GPU yet (``gpu_session16_run5.sh``: session 16's device time
ran out); run 4's failures came from the library's own int4 path.

    python benchmarks/check_int4_gemm.py [--repeats 2]
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

# (M, out, in) of the GEMMs: ragged and square.
SHAPES = [(21, 19, 44), (7, 64, 96), (48, 256, 512), (100, 384, 1000), (64, 4096, 4096)]


@jax.jit
def _products_int4(x, g, t):
  wide = jax.lax.optimization_barrier(t.astype(jnp.int4)).astype(x.dtype)
  return (jnp.dot(x, wide.T, preferred_element_type=jnp.float32),
          jnp.dot(g, wide, preferred_element_type=jnp.float32))


@jax.jit
def _products_dense(x, g, t):
  wide = t.astype(x.dtype)
  return (jnp.dot(x, wide.T, preferred_element_type=jnp.float32),
          jnp.dot(g, wide, preferred_element_type=jnp.float32))


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--repeats", type=int, default=2)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  failures = 0
  print(f"jax {jax.__version__}, {jax.devices()[0].device_kind}", flush=True)
  for m_rows, out_features, in_features in SHAPES:
    t = jnp.asarray(rng.integers(-1, 2, (out_features, in_features)), jnp.int8)
    x = jnp.asarray(rng.normal(size=(m_rows, in_features)), jnp.bfloat16)
    g = jnp.asarray(rng.normal(size=(m_rows, out_features)), jnp.bfloat16)
    want = [np.asarray(v) for v in _products_dense(x, g, t)]
    for repeat in range(args.repeats):
      got = [np.asarray(v) for v in _products_int4(x, g, t)]
      report = []
      for name, value, expected in zip(("x t^T", "g t"), got, want):
        bad = np.abs(value - expected) > 1e-3 * (1 + np.abs(expected).max())
        if bad.any():
          columns = np.nonzero(bad.any(axis=0))[0]
          report.append(f"{name}: {int(bad.sum())} of {bad.size} off, columns "
                        f"{columns[:8].tolist()}{'...' if columns.size > 8 else ''}")
      failures += bool(report)
      print(f"{'FAIL' if report else 'ok'} {m_rows}x{out_features}x{in_features} #{repeat} "
            f"{'; '.join(report)}", flush=True)
  print(f"{failures} failures")
  sys.exit(1 if failures else 0)


if __name__ == "__main__":
  main()
