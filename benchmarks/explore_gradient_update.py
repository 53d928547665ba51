"""The ES step's estimate GEMM with the SGD update in its epilogue, against XLA's two kernels.

In one ES step of EGGROLL's layer (``probe_es_step.py``: bf16 (8192, 8192), 1024
members in pairs, rank 1) XLA runs the estimate ``a b^T`` (``a`` the
fitness-weighted ``A`` factors, ``b`` the ``B`` factors, both ``(8192, 512)``)
as a Triton GEMM that writes the bf16 gradient (111 us, session 19), then a
loop fusion that reads it and the weights and writes the weights (93 us). A
GEMM that reads the weight tile in its epilogue and writes ``w + step * acc``
moves 134 MB less twice. This measures, in device time on one GPU:

* ``xla dot``: XLA's GEMM alone (bf16 out);
* ``xla dot + update``: the GEMM, then ``w + step * g`` (the ES step's form);
* ``pallas dot BMxBNxBK/warps/stages``: a Pallas Triton GEMM, bf16 out;
* ``pallas update ...``: the same tiles with ``w + step * acc`` in the
  epilogue, ``w`` donated and aliased to the output (in place).

Every output is compared with a float32 reference of the same math.

    python benchmarks/explore_gradient_update.py --out benchmarks/out   # GPU
    python benchmarks/explore_gradient_update.py --quick                # CPU (interpret)

``--ops`` measures the library's ``virtual_weight_update`` instead, per gradient
config, against ``virtual_weight_gradient`` followed by the step in XLA.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
from jaxnoise.ops import _pallas  # noqa: E402

_F32 = jnp.float32
_DIMS_NT = (((1,), (1,)), ((), ()))

CONFIGS = [  # (block_m, block_n, block_k, num_warps, num_stages)
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 4),
    (128, 256, 64, 8, 3),
    (256, 128, 64, 8, 3),
    (64, 256, 64, 4, 4),
    (128, 256, 32, 8, 4),
]


def _gemm_kernel(a_ref, b_ref, step_ref, *refs, n_k, block_m, block_n, block_k, update):
  w_ref, out_ref = refs if update else (None,) + refs
  m0 = pl.program_id(0) * block_m
  n0 = pl.program_id(1) * block_n

  def body(i, acc):
    k0 = pl.multiple_of(i * block_k, block_k)
    a = a_ref[pl.ds(m0, block_m), pl.ds(k0, block_k)]
    b = b_ref[pl.ds(n0, block_n), pl.ds(k0, block_k)]
    return acc + jax.lax.dot_general(a, b, _DIMS_NT, preferred_element_type=_F32)

  acc = jax.lax.fori_loop(0, n_k // block_k, body, jnp.zeros((block_m, block_n), _F32))
  tile = (pl.ds(m0, block_m), pl.ds(n0, block_n))
  if update:
    acc = w_ref[tile].astype(_F32) + step_ref[0] * acc
  out_ref[tile] = acc.astype(out_ref.dtype)


def pallas_gemm(a, b, step, w=None, *, config, interpret=False):
  block_m, block_n, block_k, num_warps, num_stages = config
  rows, n_k = a.shape
  cols = b.shape[0]
  update = w is not None
  kernel = functools.partial(_gemm_kernel, n_k=n_k, block_m=block_m, block_n=block_n,
                             block_k=block_k, update=update)
  operands = (a, b, step) + ((w,) if update else ())
  return _pallas.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((rows, cols), a.dtype if w is None else w.dtype),
      grid=(rows // block_m, cols // block_n),
      input_output_aliases={3: 0} if update else {},
      compiler_params=_pallas.compiler_params(num_warps, num_stages),
      interpret=interpret, name="gradient_update" if update else "gradient_gemm",
  )(*operands)


def _op_cases(measure, rows, cols, w, step, interpret):
  """``virtual_weight_update`` per gradient config against the gradient, then the step."""
  import jaxnoise  # pylint: disable=g-import-not-at-top
  from jaxnoise.ops.virtual_noise import config as config_lib  # pylint: disable=g-import-not-at-top
  pop = 64 if interpret else 1024
  seeds = jaxnoise.draw_seeds(jax.random.key(3), pop, antithetic=True)
  fitness = jax.random.normal(jax.random.key(4), (pop,), _F32)
  implementation = "interpret" if interpret else "pallas"
  kwargs = dict(antithetic=True, rank=1, implementation=implementation)
  want = (w.astype(_F32) + step[0] * jaxnoise.virtual_weight_gradient(
      fitness, seeds, (rows, cols), 0.01, **dict(kwargs, implementation="reference")))
  configs = {
      "tiles f32 (default)": config_lib.LowRankGradientConfig(),
      "tiles bf16 128x256x64/8/3": config_lib.LowRankGradientConfig(
          operand_dtype="bfloat16", block_rows=128, block_cols=256, block_k=64, num_warps=8,
          num_stages=3),
      "xla gemm bf16": config_lib.LowRankGradientConfig(operand_dtype="bfloat16", xla_gemm=True),
  }
  for name, config in configs.items():
    def gradient_then_step(w, a, b, s, config=config):
      del a, b
      gradient = jaxnoise.virtual_weight_gradient(fitness, seeds, w.shape, 0.01, config=config,
                                                  **kwargs)
      return (w.astype(_F32) + s[0] * gradient).astype(w.dtype)

    def update(w, a, b, s, config=config):
      del a, b
      return jaxnoise.virtual_weight_update(w, fitness, seeds, 0.01, s[0], config=config,
                                            **kwargs)

    measure(f"op gradient, then step: {name}", gradient_then_step, want, True)
    measure(f"op virtual_weight_update: {name}", update, want, True)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--quick", action="store_true", help="small shapes, interpret mode")
  parser.add_argument("--calls", type=int, default=10)
  parser.add_argument("--ops", action="store_true",
                      help="the library's ops instead: virtual_weight_update per config against "
                           "virtual_weight_gradient then the step in XLA (1024 members, rank 1)")
  args = parser.parse_args(argv)
  interpret = args.quick or jax.default_backend() != "gpu"
  rows, cols, n_k = (256, 384, 128) if args.quick else (8192, 8192, 512)
  configs = [(64, 128, 64, 4, 2)] if args.quick else CONFIGS
  keys = jax.random.split(jax.random.key(0), 3)
  a = jax.random.normal(keys[0], (rows, n_k), _F32).astype(jnp.bfloat16)
  b = jax.random.randint(keys[1], (cols, n_k), -4, 5).astype(jnp.bfloat16)
  w = (jax.random.normal(keys[2], (rows, cols), _F32) * 0.02).astype(jnp.bfloat16)
  step = jnp.full((1,), 1e-3, _F32)
  exact = jnp.dot(a.astype(_F32), b.astype(_F32).T, precision=jax.lax.Precision.HIGHEST)
  want_update = w.astype(_F32) + step[0] * exact

  def xla_dot(a, b):
    return jnp.dot(a, b.T, preferred_element_type=_F32).astype(jnp.bfloat16)

  def xla_update(w, a, b, step):  # the ES step's form: bf16 g, bf16 update, bf16 add
    g = xla_dot(a, b)
    return w + (step[0].astype(jnp.bfloat16) * g)

  def rel_err(got, want):
    got = np.asarray(got, np.float32)
    want = np.asarray(want, np.float32)
    return float(np.abs(got - want).max() / np.abs(want).max())

  results = []

  def measure(name, fn, ref, donate_w):
    record = {"case": name}
    try:
      if donate_w:
        jitted = jax.jit(fn, donate_argnums=(0,))
        out = jitted(jnp.copy(w), a, b, step)
        record["max_rel_err"] = rel_err(out, ref)
        del out
        if not interpret:
          arg_sets = [(jnp.copy(w), a, b, step) for _ in range(args.calls + 1)]
          timing = _harness.device_busy(jitted, arg_sets=arg_sets)
          del arg_sets
      else:
        jitted = jax.jit(fn)
        record["max_rel_err"] = rel_err(jitted(a, b), ref)
        timing = None if interpret else _harness.device_busy(jitted, a, b, calls=args.calls)
      if not interpret and timing:
        record["device_us"] = round(1e3 * timing["busy_ms"], 2)
        record["kernels"] = {k: round(1e3 * v, 2) for k, v in timing["kernels"].items()}
    except Exception as error:  # pylint: disable=broad-except
      record["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    print(record, flush=True)
    results.append(record)

  if args.ops:
    _op_cases(measure, rows, cols, w, step, interpret)
    configs = []
  elif not interpret:
    measure("xla dot", xla_dot, exact, False)
    measure("xla dot + update", xla_update, want_update, True)
  for config in configs:
    label = "x".join(map(str, config[:3])) + f"/{config[3]}w/{config[4]}s"
    measure(f"pallas dot {label}",
            lambda a, b, c=config: pallas_gemm(a, b, step, config=c, interpret=interpret),
            exact, False)
    measure(f"pallas update {label}",
            lambda w, a, b, s, c=config: pallas_gemm(a, b, s, w, config=c, interpret=interpret),
            want_update, True)
  os.makedirs(args.out, exist_ok=True)
  _harness.write_json(os.path.join(args.out, "gradient_update.json"),
                      {"device": _harness.device_facts(), "results": results})
  print(_harness.table(results, ["case", "device_us", "max_rel_err", "error"]))


if __name__ == "__main__":
  main()
