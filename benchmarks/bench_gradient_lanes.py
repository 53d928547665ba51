"""The gradient estimate of a 32-values-per-word kind: lane accumulators against the row tiles.

For each shape, in device time (CUPTI) on one launch of the gradient kernel
and the fixed-tree sum of its population shares:

* ``before``: the tiles every kind got until 2026-12-03 (``(rows, 32)``
  accumulators, 32- or 64-row tiles, 4 warps);
* ``heuristic``: :func:`noise_gradient_heuristics` with the kind (lane
  accumulators in 128- or 256-row tiles);
* neighbours of the heuristic.

Every output is compared with the pure-JAX reference (relative 1e-5), and
the lane-accumulator kernel with the row-tile kernel at the same tiles and
shares bit for bit (the per-element sums are the same adds in the same order).

    python benchmarks/bench_gradient_lanes.py --out $OUT [--kind rademacher] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import jaxnoise  # noqa: E402
from jaxnoise import noise as noise_lib  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402

# (pop, shape, offset): EGGROLL's population on a 1M block, a 4096^2 layer, a huge population
# on a small layer, a ragged block past 2**32, a bias-sized vector.
SHAPES = [(1024, (1024, 1024), 0), (256, (4096, 4096), 0), (65536, (64, 64), 0),
          (1000, (333, 1001), 2**32 - 4000), (4096, (1000,), 7)]
QUICK_SHAPES = [(8, (40, 70), 3), (6, (100,), 2**32 - 50)]


def _before(n_elements: int, n_individuals: int) -> config_lib.NoiseGradientConfig:
  """The one-value-per-word tiles (what every kind got before lane accumulators)."""
  config = config_lib.noise_gradient_heuristics(n_elements, n_individuals)
  assert not config.lane_accumulators
  return config


def _case(args, pop, shape, offset, kind):
  kind_ = noise_lib.get_kind(kind)
  rng = np.random.default_rng(pop + math.prod(shape))
  fitness = jnp.asarray(rng.normal(size=pop), jnp.float32)
  seeds = jnp.asarray(rng.integers(0, 2**32, pop, dtype=np.uint64).astype(np.uint32))
  n = math.prod(shape)
  fn = jaxnoise.virtual_weight_gradient if len(shape) == 2 else jaxnoise.virtual_bias_gradient
  shape_arg = shape if len(shape) == 2 else shape[0]

  def op(config, implementation=args.implementation):
    return jax.jit(lambda f, s: fn(f, s, shape_arg, 0.1, None, offset, kind=kind,
                                   implementation=implementation, config=config))

  reference = op(None, "reference")(fitness, seeds)
  heuristic = config_lib.noise_gradient_heuristics(n, pop, kind_)
  configs = {"before": _before(n, pop), "heuristic": heuristic}
  for label, change in (("rows x2", dict(block_rows=heuristic.block_rows * 2)),
                        ("rows /2", dict(block_rows=max(1, heuristic.block_rows // 2))),
                        ("warps", dict(num_warps=4 if heuristic.num_warps == 8 else 8)),
                        ("splits x4", dict(pop_splits=(heuristic.pop_splits or 1) * 4)),
                        ("no lanes", dict(lane_accumulators=False))):
    configs[label] = dataclasses.replace(heuristic, **change)
  record = {"pop": pop, "shape": list(shape), "offset": offset, "kind": kind, "configs": {}}
  outputs = {}
  for label, config in configs.items():
    kernel = op(config)
    out = kernel(fitness, seeds)
    outputs[label] = np.asarray(out)
    err = float(np.abs(outputs[label] - np.asarray(reference)).max()
                / np.abs(np.asarray(reference)).max())
    if not err <= 1e-5:
      raise AssertionError(f"{label} {config}: relative error {err} against the reference")
    entry = {"config": dataclasses.asdict(config), "rel_err": err}
    busy = _harness.device_busy(kernel, fitness, seeds)
    if busy is not None:
      entry["busy_ms"] = busy["busy_ms"]
      entry["noise_values_per_s"] = pop * n / busy["busy_ms"] * 1e3
    record["configs"][label] = entry
  if kind_.values_per_word == 32:
    same = np.array_equal(outputs["heuristic"], outputs["no lanes"])
    record["lanes_bit_for_bit"] = bool(same)
    if not same:
      raise AssertionError("lane accumulators changed the bits at the same tiles and shares")
  times = {k: v.get("busy_ms") for k, v in record["configs"].items()}
  if times["before"] and times["heuristic"]:
    record["speedup_vs_before"] = times["before"] / times["heuristic"]
  return record


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--kind", default="rademacher")
  parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU interpret mode)")
  parser.add_argument("--budget", type=float, default=240.0, help="seconds before skipping")
  parser.add_argument("--out", default="benchmarks/out")
  args = parser.parse_args()
  args.implementation = "pallas" if jax.default_backend() == "gpu" else "interpret"
  budget = _harness.Budget(args.budget)
  results = []
  for pop, shape, offset in QUICK_SHAPES if args.quick else SHAPES:
    _harness.run_case(results, f"gradient {args.kind} {pop}x{shape} offset={offset}",
                      functools.partial(_case, args, pop, shape, offset, args.kind), budget)
  rows = []
  for record in results:
    for label, entry in record.get("configs", {}).items():
      rows.append({"case": record["case"], "config": label, "busy_ms": entry.get("busy_ms"),
                   "rel_err": entry["rel_err"]})
  print(_harness.table(rows, ["case", "config", "busy_ms", "rel_err"]))
  _harness.write_json(os.path.join(args.out, f"gradient_lanes_{args.kind}.json"),
                      {**_harness.device_facts(), "results": results})
  errors = [r for r in results if "error" in r]
  print(f"{len(results)} cases, {len(errors)} errors")
  sys.exit(1 if errors else 0)


if __name__ == "__main__":
  main()
