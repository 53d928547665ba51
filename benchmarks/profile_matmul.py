"""One compiled call of the packed matmul per case, for Nsight Compute.

Each case is ``MxOUTxIN`` (bfloat16 ``x``, the heuristic's tiles), optionally
followed by ``:field=value,...`` to replace fields of that config
(``method=wgmma`` starts from ``MatmulConfig.wgmma_config``'s tiles instead, and
``in_flight=2`` sets ``mosaic_gpu_matmul.STEPS_IN_FLIGHT``). With no
cases: one and two rows at 4096^2 and 8192^2 (session 18). Run it under
``ncu -k regex:ternary_matmul`` (the kernels come in the order printed):

    ncu --clock-control none -k regex:ternary_matmul --section SpeedOfLight \\
        --section WarpStateStats python3 benchmarks/profile_matmul.py \\
        8x4096x4096 8x4096x4096:num_stages=2,split_k=4
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import offline_ptx  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise.ops.ternary import mosaic_gpu_matmul, pallas_triton_matmul, reference  # noqa: E402
from jaxnoise.ops.ternary.config import MatmulConfig  # noqa: E402

DEFAULT_CASES = ("1x4096x4096", "1x8192x8192", "2x8192x8192")


def parse_case(spec: str) -> tuple[tuple[int, int, int], dict]:
  """``"8x4096x4096:num_stages=2,split_k=4"`` -> ``((8, 4096, 4096), {"num_stages": 2, ...})``."""
  dims, _, fields = spec.partition(":")
  shape = tuple(int(d) for d in dims.split("x"))
  if len(shape) != 3:
    raise ValueError(f"a case is MxOUTxIN[:field=value,...], got {spec!r}")
  return shape, offline_ptx.parse_overrides(filter(None, fields.split(",")))


def main(specs):
  default_in_flight = mosaic_gpu_matmul.STEPS_IN_FLIGHT
  for spec in specs or DEFAULT_CASES:
    (m_rows, out_features, in_features), overrides = parse_case(spec)
    shape = (m_rows, out_features, in_features)
    mosaic_gpu_matmul.STEPS_IN_FLIGHT = int(overrides.pop("in_flight", default_in_flight))
    base = (MatmulConfig.wgmma_config(shape) if overrides.get("method") == "wgmma"
            else MatmulConfig.get_heuristics_config(shape, jnp.bfloat16))
    config = dataclasses.replace(base, **overrides)
    codes = jax.random.randint(jax.random.key(0), (out_features, in_features), 0,
                               reference.n_codes(11))
    packed = reference.pack_codes_reference(codes)
    scale = jnp.full((out_features,), 0.5, jnp.float32)
    x = jax.random.normal(jax.random.key(1), (m_rows, in_features), jnp.bfloat16)
    call = jax.jit(functools.partial(pallas_triton_matmul.ternary_matmul, C=11,
                                     out_dtype=jnp.bfloat16, config=config))
    print(f"case M={m_rows} {out_features}x{in_features} {config}", flush=True)
    call(x, packed, scale).block_until_ready()


if __name__ == "__main__":
  main(sys.argv[1:])
