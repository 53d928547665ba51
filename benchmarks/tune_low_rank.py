"""Device time of the low-rank forward's configs on EGGROLL's benchmark (GPU).

1024 members x one row, an (8192, 8192) layer, antithetic pairs, bf16 and
float32, ranks 1 and 4: the floor (XLA's GEMM ``x W^T``) and the library's
path (that GEMM, then the low-rank kernel reading its output) over a grid of
kernel configs. Times are device busy time per call from CUPTI
(``_harness.device_busy``: kernel durations summed, no host dispatch), beside
the wall-clock median of round-robin timing; the fraction of the floor is
``floor / time`` for both.

    python benchmarks/tune_low_rank.py --out $OUT [--budget 200]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402
import jaxnoise  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--budget", type=float, default=200.0)
  parser.add_argument("--quick", action="store_true")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  budget = _harness.Budget(args.budget)
  pop, d = (16, 256) if args.quick else (1024, 8192)
  results = {**_harness.device_facts(), "cases": []}
  key = jax.random.key(0)
  grid = list(itertools.product((4, 8), (1, 3), (1024, 2048, 4096)))
  for dtype, rank in itertools.product((jnp.bfloat16, jnp.float32), (1, 4)):
    kx, kw, key = jax.random.split(key, 3)
    x = jax.random.normal(kx, (pop, 1, d), dtype)
    w = (jax.random.normal(kw, (d, d), jnp.float32) / d ** 0.5).astype(dtype)
    seeds = jnp.arange(pop, dtype=jnp.uint32) * 7 + 3
    floor = jax.jit(lambda x, w: jnp.einsum("pbk,ok->pbo", x, w))
    floor_busy = _harness.device_busy(floor, x, w)
    floor_wall = _harness.median_time(floor, x, w, repeats=20, inner=10)
    default = config_lib.low_rank_linear_heuristics(1, d, d, rank)
    configs = [("default", default)]
    for warps, stages, block in grid:
      configs.append((f"w={warps} s={stages} block={block}", dataclasses.replace(
          default, num_warps=warps, num_stages=stages, block_reduce=min(block, d),
          block_emit=min(block, d))))
    reference = None
    for name, config in configs:
      if not budget.ok():
        break
      fn = jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, antithetic=True,
                                     rank=rank, config=config, out_dtype=dtype))
      case = {"dtype": jnp.dtype(dtype).name, "rank": rank, "config": name}
      try:
        out = fn(x, w, None, seeds, 0.01)
        if reference is None:
          reference = out.astype(jnp.float32)
        case["max_diff_vs_default"] = float(jnp.max(jnp.abs(out.astype(jnp.float32) - reference)))
        busy = _harness.device_busy(fn, x, w, None, seeds, 0.01)
        wall = _harness.median_time(fn, x, w, None, seeds, 0.01, repeats=20, inner=10)
        case["wall_ms"] = wall * 1e3
        case["wall_fraction"] = floor_wall / wall
        if busy and floor_busy:
          case["busy_ms"] = busy["busy_ms"]
          case["busy_fraction"] = floor_busy["busy_ms"] / busy["busy_ms"]
          case["kernels"] = busy["kernels"]
      except Exception as e:  # noqa: BLE001
        case["error"] = repr(e)[:300]
      results["cases"].append(case)
      print(f"{case['dtype']:9s} r{rank} {name:34s} busy {case.get('busy_ms', float('nan')):.4f} ms "
            f"{case.get('busy_fraction', float('nan')):6.1%}  wall {case.get('wall_ms', float('nan')):.4f} "
            f"ms {case.get('wall_fraction', float('nan')):6.1%} {case.get('error', '')[:80]}", flush=True)
    results["cases"].append({"dtype": jnp.dtype(dtype).name, "rank": rank, "config": "floor",
                             "wall_ms": floor_wall * 1e3,
                             "busy_ms": floor_busy and floor_busy["busy_ms"],
                             "kernels": floor_busy and floor_busy["kernels"]})
    print(f"floor {jnp.dtype(dtype).name} busy {floor_busy and floor_busy['busy_ms']} wall "
          f"{floor_wall * 1e3:.4f}", flush=True)
  with open(os.path.join(args.out, "tune_low_rank.json"), "w") as f:
    json.dump(results, f, indent=1)


if __name__ == "__main__":
  main()
