"""Tilings of the packed-code decode kernels, in device time (session 9).

    python3 benchmarks/probe_decode_narrow.py --out $OUT

``ternary_matmul``'s ``"decode"`` method decodes ``t`` for XLA's GEMM into
int4 nibbles or the compute dtype (``MatmulConfig.decode_to``). On an H200
(session 9, run 3) the int4 kernel moved 2.3-2.6 TB/s at the elementwise
heuristic's tiling (one row, 4096 codes per chunk), against 3.7 TB/s for the
bf16 one: it is not at copy bandwidth. This times each decode at a few
tilings, at (4096, 4096) and (8192, 8192), and prints TB/s on bytes moved
(0.75 byte read per weight; 0.5 or 2 written). Run 4 of session 9 also timed
an int8 decode, since removed (commit ``acc6746`` has it).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise.ops.ternary import pallas_triton as kernels  # noqa: E402
from jaxnoise.ops.ternary.config import ElementwiseConfig  # noqa: E402

C = 5
# (block_rows, block_groups, num_warps, num_stages); None: the heuristic.
TILINGS = [None, (1, 1024, 8, 1), (2, 512, 4, 1), (2, 1024, 8, 1), (4, 256, 4, 1),
           (4, 512, 8, 1), (8, 128, 4, 1), (8, 256, 8, 1), (1, 512, 4, 2), (16, 64, 4, 1)]
TARGETS = {"int4": 0.5, "bf16": 2.0}


def decoder(target: str, config):
  if target == "bf16":
    return lambda packed, ones: kernels.ternary_decode(packed, ones, C=C, dtype=jnp.bfloat16,
                                                       config=config)
  return lambda packed, ones: kernels.ternary_decode_int4(packed, C=C, config=config)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--heuristic-only", action="store_true",
                      help="only the elementwise heuristic's tiling")
  args = parser.parse_args(argv)
  tilings = TILINGS[:1] if args.heuristic_only else TILINGS
  results = {}
  for shape in ((4096, 4096), (8192, 8192)):
    copies = 8
    packs = [jax.random.randint(jax.random.key(i), (shape[0], 3 * shape[1] // 4), 0, 256,
                                jnp.int32).astype(jnp.uint8) for i in range(copies)]
    ones = jnp.ones((shape[0],), jnp.float32)
    for target, written in TARGETS.items():
      for tiling in tilings:
        config = None if tiling is None else ElementwiseConfig(*tiling)
        decode = decoder(target, config)
        run = jax.jit(lambda packs, ones, decode=decode: [decode(p, ones) for p in packs])
        name = f"{shape[0]}x{shape[1]} {target} {tiling or 'heuristic'}"
        try:
          busy = _harness.device_busy(run, packs, ones, calls=3)
        except Exception as error:  # pylint: disable=broad-except
          results[name] = {"error": repr(error)[:300]}
          print(f"{name}: {results[name]['error']}", flush=True)
          continue
        if busy is None:
          continue
        seconds = busy["busy_ms"] / 1e3 / copies
        tbps = shape[0] * shape[1] * (0.75 + written) / seconds / 1e12
        results[name] = {"us": seconds * 1e6, "tb_per_s": tbps}
        print(f"{name}: {seconds * 1e6:.1f} us, {tbps:.2f} TB/s", flush=True)
  _harness.write_json(str(pathlib.Path(args.out) / "probe_decode_narrow.json"),  # makes the folder
                      {**_harness.device_facts(), "results": results})


if __name__ == "__main__":
  main()
