"""The kernels' hash with multiply-high right shifts against plain shifts.

``jaxnoise.ops._pallas.mix32`` writes each ``x >> s`` of the finaliser as
``mul.hi.u32(x, 2**(32 - s))`` (inline PTX), which ptxas keeps on the FMA
pipe (``IMAD.HI``) instead of the ALU pipe (``SHF``), where the xors, the
kinds' bit operations and the selects already queue. For each op and shape,
in device time (CUPTI), the kernel is compiled twice, with
``_pallas.MIX32_BY_MULTIPLY_HIGH`` off (``shifts``) and on (``mulhi``); the
outputs must be equal bit for bit (same noise, same tiles, same order), and
each is checked against the pure-JAX reference.

    python benchmarks/bench_hash_pipes.py --out $OUT [--only reduce,gradient] [--quick]

``--quick`` runs tiny shapes through the interpreter (CPU): the shift form
only, since the inline PTX exists only compiled.
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

import _harness  # noqa: E402
import jaxnoise  # noqa: E402
from jaxnoise.ops import _pallas  # noqa: E402

# (op, kind, pop, shape, offset, dtype). Reduce-metric: issue 14's three shapes and a block
# past 2**32; forward / input gradient: 1024 members, one row each; gradient: EGGROLL's
# population on a 1M block and a ragged block past 2**32.
CASES = [
    ("reduce", "binomial", 65536, (4096,), 0, "float32"),
    ("reduce", "binomial", 1024, (1 << 20,), 0, "float32"),
    ("reduce", "binomial", 3000, (3_000_000,), 0, "float32"),
    ("reduce", "binomial", 1000, (333_333,), 2**32 - 5000, "float32"),
    ("reduce", "uniform", 1024, (1 << 20,), 0, "float32"),
    ("reduce", "normal", 1024, (1 << 20,), 0, "float32"),
    ("forward", "binomial", 1024, (2048, 2048), 0, "bfloat16"),
    ("forward", "binomial", 1024, (2048, 2048), 0, "float32"),
    ("forward", "uniform", 1024, (2048, 2048), 0, "bfloat16"),
    ("forward", "binomial", 512, (1000, 1500), 2**32 - 7000, "bfloat16"),
    ("input_grad", "binomial", 1024, (2048, 2048), 0, "bfloat16"),
    ("input_grad", "binomial", 1024, (2048, 2048), 0, "float32"),
    ("gradient", "binomial", 1024, (1024, 1024), 0, "float32"),
    ("gradient", "normal", 1024, (1024, 1024), 0, "float32"),
    ("gradient", "binomial", 1000, (333, 1001), 2**32 - 4000, "float32"),
]
QUICK_CASES = [
    ("reduce", "binomial", 9, (300,), 2**32 - 100, "float32"),
    ("forward", "binomial", 4, (40, 70), 3, "float32"),
    ("input_grad", "binomial", 4, (40, 70), 3, "float32"),
    ("gradient", "binomial", 6, (33, 50), 2**32 - 900, "float32"),
]


def _op(op, kind, shape, offset, implementation):
  """A jitted ``f(inputs...)`` of the op at ``implementation``."""
  common = dict(kind=kind, implementation=implementation)
  if op == "reduce":
    return jax.jit(lambda center, seeds: jaxnoise.virtual_reduce_metric(
        center, seeds, 0.05, None, offset, **common))
  if op == "gradient":
    return jax.jit(lambda fitness, seeds: jaxnoise.virtual_weight_gradient(
        fitness, seeds, shape, 0.1, None, offset, **common))
  forward = functools.partial(jaxnoise.virtual_perturbed_linear, offset=offset, **common)
  if op == "forward":
    return jax.jit(lambda x, w, seeds: forward(x, w, None, seeds, 0.05))

  def input_grad(x, w, seeds, cotangent):
    _, vjp = jax.vjp(lambda x_: forward(x_, w, None, seeds, 0.05), x)
    return vjp(cotangent)[0]
  return jax.jit(input_grad)


def _inputs(op, pop, shape, dtype, rng):
  seeds = jnp.asarray(rng.integers(0, 2**32, pop, dtype=np.uint64).astype(np.uint32))
  if op == "reduce":
    return (jnp.asarray(rng.normal(size=shape), jnp.float32), seeds)
  if op == "gradient":
    return (jnp.asarray(rng.normal(size=pop), jnp.float32), seeds)
  out_features, in_features = shape
  x = jnp.asarray(rng.normal(size=(pop, 1, in_features)), dtype)
  w = jnp.asarray(rng.normal(size=shape) / np.sqrt(in_features), dtype)
  if op == "forward":
    return (x, w, seeds)
  return (x, w, seeds, jnp.asarray(rng.normal(size=(pop, 1, out_features)), jnp.float32))


def _case(args, op, kind, pop, shape, offset, dtype):
  rng = np.random.default_rng(pop + sum(shape) + offset % 1000)
  inputs = _inputs(op, pop, shape, dtype, rng)
  reference = np.asarray(_op(op, kind, shape, offset, "reference")(*inputs), np.float32)
  scale = max(float(np.abs(reference).max()), 1e-30)
  tolerance = 1e-5 if dtype == "float32" else 2e-2
  variants = {"shifts": False} if args.implementation == "interpret" else {
      "shifts": False, "mulhi": True}
  record = {"op": op, "kind": kind, "pop": pop, "shape": list(shape), "offset": offset,
            "dtype": dtype, "variants": {}}
  outputs = {}
  for label, by_multiply in variants.items():
    _pallas.MIX32_BY_MULTIPLY_HIGH = by_multiply
    try:
      fn = _op(op, kind, shape, offset, args.implementation)
      out = np.asarray(fn(*inputs), np.float32)
      busy = _harness.device_busy(fn, *inputs)
    finally:
      _pallas.MIX32_BY_MULTIPLY_HIGH = True
    err = float(np.abs(out - reference).max() / scale)
    if not err <= tolerance:
      raise AssertionError(f"{label}: relative error {err} against the reference")
    outputs[label] = out
    record["variants"][label] = {"rel_err": err,
                                 "busy_ms": busy["busy_ms"] if busy else None}
  if "mulhi" in outputs:
    same = np.array_equal(outputs["shifts"].view(np.uint32), outputs["mulhi"].view(np.uint32))
    record["bit_for_bit"] = bool(same)
    if not same:
      raise AssertionError("the multiply-high hash changed the bits")
    times = [record["variants"][v]["busy_ms"] for v in ("shifts", "mulhi")]
    if all(times):
      record["speedup"] = times[0] / times[1]
  return record


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--only", default="", help="comma-separated ops (reduce, forward, ...)")
  parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU interpret mode)")
  parser.add_argument("--budget", type=float, default=300.0, help="seconds before skipping")
  parser.add_argument("--out", default="benchmarks/out")
  args = parser.parse_args()
  args.implementation = "pallas" if jax.default_backend() == "gpu" else "interpret"
  only = set(filter(None, args.only.split(",")))
  budget = _harness.Budget(args.budget)
  results = []
  for case in QUICK_CASES if args.quick else CASES:
    if only and case[0] not in only:
      continue
    op, kind, pop, shape, offset, dtype = case
    _harness.run_case(results, f"{op} {kind} {pop}x{shape} {dtype} offset={offset}",
                      functools.partial(_case, args, *case), budget)
  rows = []
  for record in results:
    variants = record.get("variants", {})
    rows.append({"case": record["case"],
                 "shifts_ms": variants.get("shifts", {}).get("busy_ms"),
                 "mulhi_ms": variants.get("mulhi", {}).get("busy_ms"),
                 "speedup": record.get("speedup"), "bits": record.get("bit_for_bit")})
  print(_harness.table(rows, ["case", "shifts_ms", "mulhi_ms", "speedup", "bits"]))
  _harness.write_json(os.path.join(args.out, "hash_pipes.json"),
                      {**_harness.device_facts(), "results": results})
  errors = [r for r in results if "error" in r]
  print(f"{len(results)} cases, {len(errors)} errors")
  sys.exit(1 if errors else 0)


if __name__ == "__main__":
  main()
