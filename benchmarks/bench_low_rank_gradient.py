"""The low-rank gradient's contraction: the Pallas tile kernel against one XLA GEMM.

``virtual_weight_gradient(..., rank=r)`` contracts materialised factors over
``pop * r``. The default is a Pallas kernel whose tiles sum in fixed steps
(so a device's row shard equals those rows of the one-device gradient bit for
bit); ``LowRankGradientConfig(xla_gemm=True)`` is one XLA (cuBLAS) GEMM per
chunk. For each shape this measures both (median ms), their largest relative
difference, and whether rows ``[row0, row0 + n)`` formed alone equal those
rows of the whole gradient (``rows_bit_exact``, the property
``jaxnoise.parallel`` relies on).

    python benchmarks/bench_low_rank_gradient.py --out benchmarks/out   # GPU
    python benchmarks/bench_low_rank_gradient.py --quick                # CPU (interpret)

Writes ``<out>/low_rank_gradient.json``.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402
from jaxnoise.ops.virtual_noise import api  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402
from jaxnoise import noise as noise_lib  # noqa: E402


def gradient_case(pop, shape, rank, implementation, repeats):
  seeds = jaxnoise.draw_seeds(jax.random.key(0), pop, antithetic=True)
  fitness = jaxnoise.optim.centered_rank(jax.random.normal(jax.random.key(1), (pop,)))
  kind = noise_lib.get_kind("binomial")
  record = {"pop": pop, "shape": list(shape), "rank": rank}
  outputs = {}
  for name, config in (("tiles", config_lib.LowRankGradientConfig()),
                       ("xla_gemm", config_lib.LowRankGradientConfig(xla_gemm=True))):
    fn = jax.jit(functools.partial(api._gradient, shape=shape, sigma=0.01, pop_size=pop,  # pylint: disable=protected-access
                                   offset=12345, kind=kind, antithetic=True,
                                   implementation=implementation, config=config, rank=rank))
    outputs[name] = fn(fitness, seeds)
    record[f"{name}_ms"] = 1e3 * _harness.median_time(fn, fitness, seeds, repeats=repeats)
  whole = np.asarray(outputs["tiles"])
  scale = float(np.abs(whole).max())
  record["max_rel_diff_tiles_vs_xla_gemm"] = float(
      np.abs(whole - np.asarray(outputs["xla_gemm"])).max()) / max(scale, 1e-30)
  # A device's shard of an uneven split: rows that start inside a tile.
  row0 = shape[0] // 3 + 1
  count = shape[0] // 2
  part = jax.jit(lambda f, s: api._gradient(  # pylint: disable=protected-access
      f, s, shape, 0.01, pop, 12345, kind, True, implementation,
      config_lib.LowRankGradientConfig(), rank=rank, rows=(row0, count)))(fitness, seeds)
  record["rows_bit_exact"] = bool(np.array_equal(np.asarray(part), whole[row0:row0 + count]))
  record["tiles_over_xla_gemm"] = record["tiles_ms"] / record["xla_gemm_ms"]
  return record


# Tile configs screened by ``--sweep`` (the first is the default).
SWEEP = (dict(), dict(block_rows=128, block_cols=128, block_k=32, num_warps=8, num_stages=3),
         dict(block_rows=128, block_cols=128, block_k=32, num_warps=8, num_stages=4),
         dict(block_rows=128, block_cols=256, block_k=32, num_warps=8, num_stages=4),
         dict(block_rows=256, block_cols=128, block_k=32, num_warps=8, num_stages=3),
         dict(block_rows=128, block_cols=128, block_k=64, num_warps=8, num_stages=3),
         dict(operand_dtype="bfloat16", block_rows=128, block_cols=256, block_k=64,
              num_warps=8, num_stages=3),
         dict(operand_dtype="bfloat16", block_rows=128, block_cols=256, block_k=64,
              num_warps=8, num_stages=4),
         dict(operand_dtype="bfloat16", block_rows=128, block_cols=128, block_k=64,
              num_warps=4, num_stages=4),
         dict(operand_dtype="bfloat16", xla_gemm=True))


def sweep_case(pop, shape, rank, implementation, calls):
  """Device busy time (CUPTI) of each tile config and of the XLA GEMM, one shape."""
  seeds = jaxnoise.draw_seeds(jax.random.key(0), pop, antithetic=True)
  fitness = jaxnoise.optim.centered_rank(jax.random.normal(jax.random.key(1), (pop,)))
  kind = noise_lib.get_kind("binomial")
  record = {"pop": pop, "shape": list(shape), "rank": rank}
  configs = [("xla_gemm", config_lib.LowRankGradientConfig(xla_gemm=True))]
  configs += [(",".join(f"{k}={v}" for k, v in c.items()) or "default",
               config_lib.LowRankGradientConfig(**c)) for c in SWEEP]
  for name, config in configs:
    fn = jax.jit(functools.partial(api._gradient, shape=shape, sigma=0.01, pop_size=pop,  # pylint: disable=protected-access
                                   offset=12345, kind=kind, antithetic=True,
                                   implementation=implementation, config=config, rank=rank))
    try:
      busy = _harness.device_busy(fn, fitness, seeds, calls=calls)
      record[name] = (round(busy["busy_ms"], 4) if busy else
                      round(1e3 * _harness.median_time(fn, fitness, seeds, repeats=3), 4))
    except Exception as error:  # pylint: disable=broad-except
      record[name] = f"error: {str(error)[:200]}"
  return record


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="tiny shapes, interpret (CPU)")
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--budget", type=float, default=60.0)
  parser.add_argument("--sweep", action="store_true",
                      help="device busy time of each tile config in SWEEP (GPU)")
  args = parser.parse_args(argv)
  if args.quick:
    cases, implementation, repeats = [(16, (40, 24), 1), (16, (33, 70), 2)], "interpret", 2
  else:
    # The LM's kernels at population 65,536 (32,768 pairs), and EGGROLL's layer.
    cases = [(65536, (512, 512), 1), (65536, (2048, 512), 1), (65536, (512, 2048), 1),
             (1024, (8192, 8192), 1), (1024, (8192, 8192), 4)]
    implementation, repeats = "auto", 10
  facts = _harness.device_facts()
  print(facts, flush=True)
  budget = _harness.Budget(args.budget)
  results = []
  for pop, shape, rank in cases:
    _harness.run_case(results, f"low-rank gradient pop={pop} shape={shape} rank={rank}",
                      functools.partial(gradient_case, pop, shape, rank, implementation,
                                        repeats), budget)
  if args.sweep:
    for pop, shape, rank in cases:
      _harness.run_case(results, f"sweep pop={pop} shape={shape} rank={rank}",
                        functools.partial(sweep_case, pop, shape, rank, implementation,
                                          2 if args.quick else 10), budget)
  _harness.write_json(os.path.join(args.out, "low_rank_gradient.json"),
                      {"facts": facts, "results": results})
  for row in results:
    if row["case"].startswith("sweep"):
      print(row)
  print(_harness.table(results, ["case", "tiles_ms", "xla_gemm_ms", "tiles_over_xla_gemm",
                                 "max_rel_diff_tiles_vs_xla_gemm", "rows_bit_exact", "error"]))


if __name__ == "__main__":
  main()
