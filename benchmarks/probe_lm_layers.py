"""The LM's layers one at a time: the fused low-rank forward against XLA's GEMM (GPU probe).

``profile_lm_step.py`` shows the fused Mosaic GEMM taking ~1.5x the device time
of the batch-inference GEMMs over the whole LM step (session 31, H100). This
probe splits that by layer shape and asks which of the GEMM's knobs matter
there: members of ``--rows`` rows (a sequence each) in antithetic pairs, each
shape ``in x out`` of the LM (``512x512`` for the attention projections,
``512x2048`` and ``2048x512`` with a bias for the MLP), timed in device time
(:func:`_harness.device_busy`, CUPTI) in one process:

* ``xla``: the floor, ``x @ kernel`` (+ bias) with the ``(in, out)`` kernel that
  ``nnx.Linear`` stores, in the layer's dtype: what the LM's inference runs
  (session 31's run 4 took ``x @ W.T`` with ``W`` as ``(out, in)``, whose times
  summed to ~1.4x inference's GEMMs);
* ``default``: :func:`jaxnoise.virtual_perturbed_linear` with the heuristic
  config (the fused GEMM, ``x B`` formed in it for "binomial");
* variants of :class:`~jaxnoise.ops.virtual_noise.config.LowRankLinearConfig`'s
  GEMM fields (``pipelined``: the tiles chained into one pipeline, the
  heuristics' choice since session 32, ``plain`` without it;
  ``stages2``, ``stages3``, ``tile64``, ``width1``, ``width4``, ``width8``;
  the heuristics take width 8 for these members since session 31) and
  ``operands`` (``x B`` from the Triton operands kernel, not the GEMM).

Each variant's output is compared with ``default``'s (they add the same noise,
so they agree to the accumulation order).

    python benchmarks/probe_lm_layers.py --out $OUT [--ranks 1,4] [--variants ...]
    python benchmarks/probe_lm_layers.py --quick   # tiny shapes, interpreter (CPU check)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jaxnoise  # noqa: E402
import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402
from jaxnoise.ops.virtual_noise import mosaic_gpu_low_rank  # noqa: E402

# Variant name -> changes to the heuristic config's fields.
VARIANTS = {
    "default": {},
    "pipelined": dict(gemm_pipelined_tiles=True),
    "plain": dict(gemm_pipelined_tiles=False),
    "stages2": dict(gemm_stages=2),
    "stages3": dict(gemm_stages=3),
    "tile64": dict(gemm_tile_n=64),
    "width1": dict(gemm_grid_width=1),
    "width4": dict(gemm_grid_width=4),
    "width8": dict(gemm_grid_width=8),
    "operands": dict(gemm_member_dots=False),
}


def _parse_shape(text: str) -> tuple[int, int, bool]:
  """``"512x2048"`` -> ``(in, out, with_bias)``; a trailing ``b`` adds a bias."""
  with_bias = text.endswith("b")
  n_in, n_out = (int(v) for v in text.rstrip("b").split("x"))
  return n_in, n_out, with_bias


def layer_case(pop: int, rows: int, n_in: int, n_out: int, with_bias: bool, rank: int,
               dtype, variants: list[str], implementation: str, calls: int) -> dict:
  """Device ms of ``xla`` and of each variant at one layer shape, and their outputs'
  largest difference from ``default``'s."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(pop, rows, n_in)), dtype)
  weight = jnp.asarray(rng.normal(size=(n_out, n_in)) / np.sqrt(n_in), dtype)
  bias = jnp.asarray(rng.normal(size=(n_out,)), dtype) if with_bias else None
  seeds = jnp.asarray(np.repeat(rng.integers(0, 2**32, size=pop // 2, dtype=np.uint32), 2))
  base = config_lib.low_rank_linear_heuristics(rows, n_in, n_out, rank, "binomial")
  record = {"shape": f"{n_in}x{n_out}", "bias": with_bias, "rank": rank, "pop": pop,
            "rows": rows, "dtype": jnp.dtype(dtype).name}

  kernel = jnp.asarray(weight.T)  # as nnx.Linear stores it

  def floor(x, kernel):
    y = x @ kernel
    return y if bias is None else y + bias

  def forward(config):
    return jax.jit(lambda x: jaxnoise.virtual_perturbed_linear(
        x, weight, bias, seeds, 0.01, 12345, kind="binomial", antithetic=True, rank=rank,
        out_dtype=dtype, implementation=implementation, config=config))

  timed = {"xla": functools.partial(jax.jit(floor), kernel=kernel)}
  for name in variants:
    timed[name] = forward(dataclasses.replace(base, fused_gemm=True, **VARIANTS[name]))
  outputs = {}
  for name, fn in timed.items():
    try:
      outputs[name] = np.asarray(fn(x), np.float32)
      busy = _harness.device_busy(fn, x, calls=calls)
      if busy is None:  # no CUPTI here (the CPU check): wall clock instead
        busy = {"busy_ms": _harness.median_time(fn, x, warmup=1, repeats=2, inner=1) * 1e3}
      record[f"{name}_ms"] = busy["busy_ms"]
    except Exception as error:  # pylint: disable=broad-except
      record[f"{name}_error"] = f"{type(error).__name__}: {error}"[:300]
  reference = outputs.get("default")
  for name, y in outputs.items():
    if name != "xla" and reference is not None:
      record[f"{name}_max_diff"] = float(np.abs(y - reference).max())
    if f"{name}_ms" in record and "xla_ms" in record and name != "xla":
      record[f"{name}_of_xla"] = record["xla_ms"] / record[f"{name}_ms"]
  return record


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--quick", action="store_true", help="tiny shapes, interpreter (CPU)")
  parser.add_argument("--pop", type=int, default=16384)
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  parser.add_argument("--ranks", default="1,4")
  parser.add_argument("--shapes", default="512x512,512x2048b,2048x512b",
                      help="in x out per layer, a trailing b for a bias")
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--calls", type=int, default=5)
  args = parser.parse_args(argv)
  implementation = "pallas"
  if args.quick:
    args.pop, args.rows, args.shapes, implementation = 4, 64, "32x256b", "interpret"
    args.ranks, args.calls = "1", 1
  variants = args.variants.split(",")
  unknown = sorted(set(variants) - set(VARIANTS))
  if unknown:
    parser.error(f"--variants: unknown {unknown}; known: {sorted(VARIANTS)}")
  print(_harness.device_facts(), "multi-row fused:", mosaic_gpu_low_rank.MULTI_ROW_MEMBERS,
        flush=True)
  results = []
  for rank in (int(r) for r in args.ranks.split(",")):
    for shape in args.shapes.split(","):
      n_in, n_out, with_bias = _parse_shape(shape)
      record = layer_case(args.pop, args.rows, n_in, n_out, with_bias, rank,
                          jnp.dtype(args.dtype), variants, implementation, args.calls)
      results.append(record)
      cells = " ".join(f"{name} {record[f'{name}_ms']:.3f}"
                       + (f" ({record[f'{name}_of_xla']:.3f})" if f"{name}_of_xla" in record
                          else "")
                       for name in ["xla", *variants] if f"{name}_ms" in record)
      errors = [name for name in variants if f"{name}_error" in record]
      print(f"rank {rank} {shape}: {cells}" + (f"; errors {errors}" if errors else ""),
            flush=True)
  os.makedirs(args.out, exist_ok=True)
  _harness.write_json(os.path.join(args.out, "lm_layers.json"),
                      {"facts": _harness.device_facts(), "results": results})


if __name__ == "__main__":
  main()
