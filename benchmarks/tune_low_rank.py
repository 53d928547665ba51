"""Device time of the low-rank forward's configs on EGGROLL's benchmark (GPU).

1024 members x one row, an (8192, 8192) layer, antithetic pairs, bf16 and
float32. Times are device busy time per call from CUPTI
(``_harness.device_busy``: kernel durations summed, no host dispatch), beside
the wall-clock median of round-robin timing; the fraction of the floor
(XLA's GEMM ``x W^T``) is ``floor / time`` for both.

``--path triton`` (ranks 1 and 4): the Triton path (that GEMM, then the
low-rank kernel reading its output) over a grid of kernel configs.

``--path fused`` (Hopper): the fused Mosaic GPU forward, in parts
(``--parts``): ``operands``, its operands kernel (``x_i B_i``, ranks 1, 2
and 4) alone over warps and step widths (called again and again, so ``x``
stays in L2); ``forward_operands``, the same kernel's configs inside the
whole forward (where the GEMM evicts ``x``); ``gemm``, the whole forward
over the GEMM's pipeline depth, tile order and tiles, each output compared
with the Triton path's (the reference-checked one) so a config that
computes something else is flagged.

    python benchmarks/tune_low_rank.py --out $OUT [--path fused --parts gemm] [--budget 200]
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
from jaxnoise import noise as noise_lib  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402
from jaxnoise.ops.virtual_noise import pallas_triton_low_rank  # noqa: E402


def _layer(key, pop, d, dtype):
  kx, kw = jax.random.split(key)
  x = jax.random.normal(kx, (pop, 1, d), dtype)
  w = (jax.random.normal(kw, (d, d), jnp.float32) / d ** 0.5).astype(dtype)
  return x, w, jnp.arange(pop, dtype=jnp.uint32) * 7 + 3


# The floor: XLA's GEMM of every member's row against the shared W.
_floor = jax.jit(lambda x, w: jnp.einsum("pbk,ok->pbo", x, w))


def _print(case):
  print(json.dumps(case, default=str), flush=True)


def _fused_forward(kind, rank, dtype, config):
  return jax.jit(lambda x, w, seeds: jaxnoise.virtual_perturbed_linear(
      x, w, None, seeds, 0.01, 0, kind=kind.name, antithetic=True, rank=rank, out_dtype=dtype,
      config=config))


def _time_forward(case, fn, x, w, seeds, floor_busy, reference=None, wall=True):
  """Device time (per kernel) of the forward ``fn``; its difference from ``reference``."""
  try:
    out = fn(x, w, seeds).astype(jnp.float32)
    if reference is not None:
      case["max_rel_diff_vs_triton_path"] = float(
          jnp.max(jnp.abs(out - reference)) / jnp.max(jnp.abs(reference)))
    busy = _harness.device_busy(fn, x, w, seeds)
    if busy:
      case["busy_ms"] = busy["busy_ms"]
      case["kernels_ms"] = busy["kernels"]
      case["busy_fraction"] = floor_busy["busy_ms"] / busy["busy_ms"]
    if wall:
      case["wall_ms"] = _harness.median_time(fn, x, w, seeds, repeats=20, inner=10) * 1e3
  except Exception as e:  # noqa: BLE001
    case["error"] = repr(e)[:300]


def tune_fused(args, budget, results):
  """The fused forward: its operands kernel (alone, or inside the forward), the GEMM's configs."""
  pop, d = (256, 512) if args.quick else (1024, 8192)
  kind = noise_lib.get_kind("binomial")
  key = jax.random.key(0)
  layers = {dtype: _layer(jax.random.fold_in(key, i), pop, d, dtype)
            for i, dtype in enumerate((jnp.bfloat16, jnp.float32))}
  parts = args.parts.split(",")

  def record(case):
    results["cases"].append(case)
    _print(case)

  if "operands" in parts:
    # Alone, called again and again: x stays in L2 (32 MB of float32 against 50 MB).
    for dtype, rank in itertools.product(layers, (1, 2, 4)):
      x, _, seeds = layers[dtype]
      _, b_layout = pallas_triton_low_rank._factor_layouts(kind, 0, d, d, rank)  # pylint: disable=protected-access
      default = config_lib.low_rank_linear_heuristics(1, d, d, rank, kind.name)
      for warps, block in itertools.product((4, 8, 16), (1024, 2048, 4096, 8192)):
        if not budget.ok():
          return
        config = dataclasses.replace(default, num_warps=warps, block_reduce=min(block, d))
        fn = jax.jit(functools.partial(pallas_triton_low_rank.fused_gemm_operands,
                                       reduce_layout=b_layout, rank=rank, word_hi=0,
                                       config=config))
        case = {"part": "operands", "dtype": jnp.dtype(dtype).name, "rank": rank,
                "num_warps": warps, "block_reduce": config.block_reduce}
        try:
          busy = _harness.device_busy(fn, x, seeds, 0.01)
          case["busy_us"] = busy and busy["busy_ms"] * 1e3
        except Exception as e:  # noqa: BLE001
          case["error"] = repr(e)[:300]
        record(case)
  if "forward_operands" in parts:
    # Inside the forward, where the GEMM evicts x from L2 between calls.
    operand_grid = [(warps, block, stages) for warps in (4, 8)
                    for block, stages in ((2048, 1), (2048, 2), (2048, 3), (4096, 1), (4096, 2),
                                          (8192, 1))]
    for dtype, rank in itertools.product(layers, (1, 2, 4)):
      x, w, seeds = layers[dtype]
      floor_busy = _harness.device_busy(_floor, x, w)
      default = config_lib.low_rank_linear_heuristics(1, d, d, rank, kind.name)
      for warps, block, stages in [(None, None, None)] + operand_grid:
        if not budget.ok():
          return
        config = default if warps is None else dataclasses.replace(
            default, num_warps=warps, block_reduce=min(block, d), num_stages=stages)
        case = {"part": "forward_operands", "dtype": jnp.dtype(dtype).name, "rank": rank,
                "num_warps": config.num_warps, "block_reduce": config.block_reduce,
                "num_stages": config.num_stages, "default": warps is None,
                "floor_busy_ms": floor_busy and floor_busy["busy_ms"]}
        _time_forward(case, _fused_forward(kind, rank, dtype, config), x, w, seeds, floor_busy,
                      wall=False)
        record(case)
  if "gemm" in parts:
    gemm_grid = [dict(gemm_stages=stages, gemm_grid_width=width)
                 for stages in (3, 4) for width in (1, 2, 4, 8, 16)]
    gemm_grid += [dict(gemm_tile_n=64, gemm_stages=stages) for stages in (4, 6)]
    gemm_grid += [dict(gemm_tile_k=128, gemm_stages=stages) for stages in (2, 3)]
    for dtype, rank in ((jnp.bfloat16, 1), (jnp.float32, 1), (jnp.bfloat16, 4)):
      x, w, seeds = layers[dtype]
      floor_busy = _harness.device_busy(_floor, x, w)
      default = config_lib.low_rank_linear_heuristics(1, d, d, rank, kind.name)
      reference = _fused_forward(kind, rank, dtype, dataclasses.replace(
          default, fused_gemm=False))(x, w, seeds).astype(jnp.float32)
      for changes in [{}] + gemm_grid:
        if not budget.ok():
          return
        case = {"part": "gemm", "dtype": jnp.dtype(dtype).name, "rank": rank, **changes,
                "floor_busy_ms": floor_busy and floor_busy["busy_ms"]}
        _time_forward(case, _fused_forward(kind, rank, dtype,
                                           dataclasses.replace(default, **changes)),
                      x, w, seeds, floor_busy, reference)
        record(case)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--budget", type=float, default=200.0)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--path", choices=("triton", "fused"), default="triton")
  parser.add_argument("--parts", default="operands,gemm",
                      help="fused path: comma-separated operands, forward_operands, gemm")
  args = parser.parse_args()
  os.makedirs(args.out, exist_ok=True)
  budget = _harness.Budget(args.budget)
  results = {**_harness.device_facts(), "cases": []}
  if args.path == "fused":
    try:
      tune_fused(args, budget, results)
    finally:
      _harness.write_json(os.path.join(args.out, "tune_fused_low_rank.json"), results)
    return
  pop, d = (16, 256) if args.quick else (1024, 8192)
  key = jax.random.key(0)
  grid = list(itertools.product((4, 8), (1, 3), (1024, 2048, 4096)))
  for dtype, rank in itertools.product((jnp.bfloat16, jnp.float32), (1, 4)):
    layer_key, key = jax.random.split(key)
    x, w, seeds = _layer(layer_key, pop, d, dtype)
    floor_busy = _harness.device_busy(_floor, x, w)
    floor_wall = _harness.median_time(_floor, x, w, repeats=20, inner=10)
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
