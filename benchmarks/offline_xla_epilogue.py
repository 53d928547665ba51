"""Does XLA fuse a hashed low-rank term into its GEMM? A deviceless compile says (no GPU).

    python benchmarks/offline_xla_epilogue.py --plugin PATH/xla_cuda_plugin.so [--rank 1]

Writes EGGROLL's forward (1024 members x one row, an (8192, 8192) bf16 layer)
in plain JAX: the GEMM ``x W^T``, then ``+ sigma s_i (x_i B_i) A_i^T`` with the
factors hashed in place (:func:`jaxnoise.noise.factor_block_noise`). The
PJRT CUDA plugin's XLA compiles it for an H200 without a device
(:mod:`compile_offline`), and the ENTRY of the optimised HLO is printed: if
the hash and the add ran in the GEMM's epilogue, the low-rank forward could
pass the ~94% bound of a separate pass over the GEMM's output (RESULTS.md,
session 4). Session 7 found that XLA does not fuse it: the GEMM fusion
writes its float32 output and a loop fusion hashes ``A`` and adds.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import re
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import compile_offline  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise import noise as noise_lib  # noqa: E402

POP, WIDTH = 1024, 8192


def forward(x, weight, seeds, *, rank: int, kind: str):
  """``x W^T + sigma s_i (x_i B_i) A_i^T / sqrt(r)`` in plain JAX, factors hashed in place."""
  base = jnp.einsum("pbk,ok->pbo", x, weight, preferred_element_type=jnp.float32)
  values = noise_lib.factor_block_noise(noise_lib.pair_seeds(seeds, True), 0, (WIDTH, WIDTH),
                                        rank, noise_lib.get_kind(kind))
  a, b = values[:, :, :WIDTH], values[:, :, WIDTH:]
  projected = jnp.einsum("pbk,prk->pbr", x.astype(jnp.float32), b)
  signs = noise_lib.antithetic_signs(POP, True)[:, None, None] * (0.01 / math.sqrt(rank))
  return (base + jnp.einsum("pbr,pro->pbo", projected * signs, a)).astype(x.dtype)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--plugin", required=True, help="xla_cuda_plugin.so of jax-cuda13-pjrt")
  parser.add_argument("--rank", type=int, default=1)
  parser.add_argument("--kind", default="binomial")
  args = parser.parse_args(argv)
  spec = jax.ShapeDtypeStruct
  lowered = jax.jit(lambda x, w, s: forward(x, w, s, rank=args.rank, kind=args.kind)).trace(
      spec((POP, 1, WIDTH), jnp.bfloat16), spec((WIDTH, WIDTH), jnp.bfloat16),
      spec((POP,), jnp.uint32)).lower(lowering_platforms=("cuda",))
  entry = compile_offline.optimized_entry(args.plugin, lowered)
  for line in entry.splitlines()[1:]:
    match = re.match(r"\s*(?:ROOT )?%(\S+) = (\S+) (fusion|custom-call)\(([^)]*)\), kind=(\w+)",
                     line)
    if match:
      name, shape, _, operands, kind = match.groups()
      backend = re.search(r'"kind":"(__\w+)"', line)
      print(f"{name:28s} {kind:8s} {backend.group(1) if backend else '':28s} {shape:26s} "
            f"<- {operands}")


if __name__ == "__main__":
  main()
