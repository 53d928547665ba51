"""Tiles of the fused low-rank forward's operands kernel (``x_i B_i``), EGGROLL's layer.

The fused Mosaic GPU forward (``LowRankLinearConfig.fused_gemm``) first runs
:func:`pallas_triton_low_rank.fused_gemm_operands`, one Triton program per
antithetic pair that reads the pair's two rows of ``x`` and contracts them with
the ``r`` factor vectors ``B_c`` made in registers; ``block_reduce``,
``num_warps`` and ``num_stages`` of the config are its tiles. At 1024 members x
8192 it reads 16 MB (bfloat16) or 32 MB (float32) of ``x``.

1. The kernel alone, device time (CUPTI), over 8 copies of ``x`` in turn (256 MB
   in float32, so ``x`` is not served from a warm L2), for every tile of the grid
   below; the copy bandwidth of ``x`` (a sum over it, same rotation) is the floor.
   Every output is compared with the heuristic's (keys bit for bit, coefficients
   within 1e-5 relative: the sum's order follows the tile).
2. The whole forward with the heuristic and with the kernel's fastest tiles,
   against batch inference ``x W^T`` (XLA's ``dot_general``), device time.

    python benchmarks/tune_fused_operands.py --out $OUT [--ranks 1,4] [--dtypes ...]
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import itertools
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
from jaxnoise.ops.virtual_noise import mosaic_gpu_low_rank  # noqa: E402
from jaxnoise.ops.virtual_noise import pallas_triton_low_rank  # noqa: E402

POP, FEATURES, COPIES, KIND, SIGMA = 1024, 8192, 8, "binomial", 0.01
GRID = dict(block_reduce=(1024, 2048, 4096, 8192), num_warps=(4, 8, 16), num_stages=(1, 3))


def parse_grid(text: str) -> dict:
  """``"name=v,v;name=v"`` -> the grid with those config fields' values (``None`` allowed).

  Example:
    >>> parse_grid("block_reduce=2048,4096;num_warps=8")
    {'block_reduce': (2048, 4096), 'num_warps': (8,)}
  """
  grid = {}
  for part in filter(None, text.split(";")):
    name, values = part.split("=")
    grid[name.strip()] = tuple(ast.literal_eval(v.strip()) for v in values.split(","))
  return grid


def _operands_fn(rank, config):
  kind = noise_lib.get_kind(KIND)
  _, b_layout = pallas_triton_low_rank._factor_layouts(  # pylint: disable=protected-access
      kind, 0, FEATURES, FEATURES, rank)
  return jax.jit(lambda x, seeds: pallas_triton_low_rank.fused_gemm_operands(
      x, seeds, jnp.float32(SIGMA), reduce_layout=b_layout, rank=rank,
      word_hi=mosaic_gpu_low_rank.word_hi(kind, 0), config=config))


def _tune(dtype, rank, xs, seeds, budget, grid):
  heuristic = config_lib.low_rank_linear_heuristics(1, FEATURES, FEATURES, rank, KIND)
  want = jax.tree.map(np.asarray, _operands_fn(rank, heuristic)(xs[0], seeds))
  rows = []
  for values in itertools.product(*grid.values()):
    if not budget.ok():
      break
    config = dataclasses.replace(heuristic, **dict(zip(grid, values)))
    fn = _operands_fn(rank, config)
    keys, coef, bias_coef = jax.tree.map(np.asarray, fn(xs[0], seeds))
    err = float(np.abs(coef - want[1]).max() / np.abs(want[1]).max())
    if not (np.array_equal(keys, want[0]) and np.array_equal(bias_coef, want[2])
            and err <= 1e-5):
      raise AssertionError(f"{config}: operands differ from the heuristic's (coef {err})")
    busy = _harness.device_busy(fn, arg_sets=[(x, seeds) for x in xs * 3])
    rows.append({"dtype": dtype, "rank": rank, **dict(zip(grid, values)),
                 "heuristic": config == heuristic,
                 "operands_us": busy["busy_ms"] * 1e3 if busy else None, "coef_rel_err": err})
  return heuristic, rows


def _forward_busy(x, w, seeds, rank, config):
  fn = jax.jit(lambda x, w, seeds: jaxnoise.virtual_perturbed_linear(
      x, w, None, seeds, SIGMA, 0, kind=KIND, antithetic=True, rank=rank, out_dtype=x.dtype,
      implementation="pallas", config=config))
  busy = _harness.device_busy(fn, x, w, seeds)
  out = fn(x, w, seeds)
  return out, busy


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--ranks", default="1,4")
  parser.add_argument("--dtypes", default="bfloat16,float32")
  parser.add_argument("--budget", type=float, default=240.0)
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--grid", default="",
                      help="config fields and values to sweep instead of the default grid, "
                           "e.g. 'block_reduce=2048,4096;num_warps=4,8'")
  args = parser.parse_args()
  grid = parse_grid(args.grid) if args.grid else GRID
  if jax.default_backend() != "gpu":
    parser.error("needs a GPU")
  budget = _harness.Budget(args.budget)
  results, forwards = [], []
  for dtype in args.dtypes.split(","):
    keys = jax.random.split(jax.random.key(0), COPIES + 1)
    xs = [jax.random.normal(k, (POP, 1, FEATURES), dtype) for k in keys[:COPIES]]
    w = (jax.random.normal(keys[-1], (FEATURES, FEATURES), jnp.float32)
         / np.sqrt(FEATURES)).astype(dtype)
    seeds = jaxnoise.draw_seeds(jax.random.key(1), POP, antithetic=True)
    read = _harness.device_busy(jax.jit(lambda x: jnp.sum(x, dtype=jnp.float32)),
                                arg_sets=[(x,) for x in xs * 3])
    read_us = read["busy_ms"] * 1e3 if read else None
    print(f"{dtype}: reading x (sum, rotated copies) {read_us} us", flush=True)
    inference = _harness.device_busy(jax.jit(lambda x, w: jax.lax.dot_general(
        x[:, 0], w, (((1,), (1,)), ((), ())))), xs[0], w)
    for rank in map(int, args.ranks.split(",")):
      heuristic, rows = _tune(dtype, rank, xs, seeds, budget, grid)
      for row in rows:
        row["read_x_us"] = read_us
      results.extend(rows)
      timed = sorted((r for r in rows if r["operands_us"]), key=lambda r: r["operands_us"])
      print(_harness.table(timed[:6] + [r for r in timed if r["heuristic"]],
                           ["dtype", "rank", *grid, "heuristic", "operands_us"]), flush=True)
      candidates = {"heuristic": heuristic}
      for row in timed[:2]:
        label = " ".join(f"{k}={row[k]}" for k in grid)
        candidates[label] = dataclasses.replace(heuristic, **{k: row[k] for k in grid})
      reference = None
      for label, config in candidates.items():
        out, busy = _forward_busy(xs[0], w, seeds, rank, config)
        out = np.asarray(out, np.float32)
        reference = out if reference is None else reference
        err = float(np.abs(out - reference).max() / np.abs(reference).max())
        record = {"dtype": dtype, "rank": rank, "config": label,
                  "forward_ms": busy["busy_ms"] if busy else None,
                  "inference_ms": inference["busy_ms"] if inference else None,
                  "rel_err_vs_heuristic": err}
        if busy and inference:
          record["fraction_of_inference"] = inference["busy_ms"] / busy["busy_ms"]
          record["operands_ms"] = busy["kernels"].get("virtual_low_rank_fused_operands")
        forwards.append(record)
        print(record, flush=True)
  _harness.write_json(os.path.join(args.out, "tune_fused_operands.json"),
                      {**_harness.device_facts(), "operands": results, "forwards": forwards})


if __name__ == "__main__":
  main()
