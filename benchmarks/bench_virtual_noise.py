"""Virtual-noise ops on the GPU: correctness (compiled), config sweeps, benchmarks.

Side by side in one run (SPEC section 5): (a) the jaxnoise kernel, (b) the
pure-JAX path under XLA (what a JAX user writes today: vmap over individuals,
one noise value per 32-bit word, the perturbed weight built in memory),
(c) the unperturbed GEMM floor (one GEMM of all the population's rows
against the shared weight). Medians of >= 10 timed calls after warm-up.

    python benchmarks/bench_virtual_noise.py --check --bench --out benchmarks/out
    python benchmarks/bench_virtual_noise.py --quick            # CPU, interpret mode
    python benchmarks/bench_virtual_noise.py --throughput --out benchmarks/out  # every kind

Writes ``<out>/virtual_noise.json`` and prints tables; ``--plot`` draws
``<out>/virtual_noise.png`` from the JSON.
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

import _harness  # noqa: E402  pylint: disable=g-import-not-at-top
import jaxnoise  # noqa: E402
from jaxnoise import noise as noise_lib  # noqa: E402
from jaxnoise.ops.virtual_noise import config as config_lib  # noqa: E402
from jaxnoise.ops.virtual_noise import pallas_triton  # noqa: E402

F32 = jnp.float32
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "f16": jnp.float16}
KINDS = tuple(noise_lib.KINDS)

# (name, pop, batch, out, in, shared_x)
LINEAR_SHAPES = [
    ("4096x64x256x768", 4096, 64, 256, 768, True),
    ("128x32x4096x4096", 128, 32, 4096, 4096, True),
    ("1024x256x1024x1024", 1024, 256, 1024, 1024, True),
    ("per-ind 1024x16x512x512", 1024, 16, 512, 512, False),
    ("ragged 1000x7x1000x999", 1000, 7, 1000, 999, True),
    ("eggroll 1024x1x8192x8192", 1024, 1, 8192, 8192, False),
]
# Kind throughput (--throughput): forward bf16 and weight gradient per kind, no baselines.
THROUGHPUT_SHAPES = [
    ("3000x48x1536x2304", 3000, 48, 1536, 2304, True),
    ("1024x256x1024x1024", 1024, 256, 1024, 1024, True),
    ("4096x64x256x768", 4096, 64, 256, 768, True),
]
QUICK_LINEAR_SHAPES = [
    ("quick 8x5x40x70", 8, 5, 40, 70, True),
    ("quick per-ind 6x3x33x64", 6, 3, 33, 64, False),
]


def _random(key, shape, dtype):
  return jax.random.normal(jax.random.key(key), shape, F32).astype(dtype)


def _seeds(key, pop):
  return jax.random.bits(jax.random.key(key), (pop,), jnp.uint32)


def _rel_err(value, ref):
  value = np.asarray(value, np.float64)
  ref = np.asarray(ref, np.float64)
  if not np.all(np.isfinite(value)):
    return float("inf")
  return float(np.abs(value - ref).max() / max(np.abs(ref).max(), 1e-30))


# ----------------------------------------------------------------------------
# (b) what a JAX user writes today.


def pure_jax_linear(x, weight, bias, seeds, sigma, offset, *, kind, antithetic):
  """vmap over individuals; each builds ``W + sigma N_i`` in memory."""
  kind = noise_lib.get_kind(kind)
  out_features, in_features = weight.shape
  hi, lo = noise_lib.block_index(offset, (out_features, in_features))
  high = not noise_lib.fits_32_bits(kind, offset, out_features * in_features)
  b_hi, b_lo = noise_lib.block_index(offset + out_features * in_features, (out_features,))
  dtype = x.dtype

  def member(x_i, noise, bias_noise, sign):
    perturbed = (weight.astype(F32) + (sign * sigma) * noise).astype(dtype)
    y = jnp.dot(x_i, perturbed.T, preferred_element_type=F32)
    return y + (bias.astype(F32) + (sign * sigma) * bias_noise)

  def individual(seed, x_i):
    noise = noise_lib.noise_at(seed, hi, lo, kind, high_word=high)
    bias_noise = noise_lib.noise_at(seed, b_hi, b_lo, kind, high_word=True)
    if not antithetic:
      return member(x_i, noise, bias_noise, 1.0)[None]
    x_a, x_b = (x_i, x_i) if x.ndim == 2 else x_i
    return jnp.stack([member(x_a, noise, bias_noise, 1.0), member(x_b, noise, bias_noise, -1.0)])

  pop = seeds.shape[0]
  step_seeds = seeds[0::2] if antithetic else seeds
  if x.ndim == 2:
    xs = None
  else:
    xs = x.reshape((pop // 2, 2) + x.shape[1:]) if antithetic else x
  per_step = out_features * in_features * 4
  if step_seeds.shape[0] * per_step <= (16 << 30):
    fn = jax.vmap(individual, in_axes=(0, None if xs is None else 0))
    out = fn(step_seeds, x if xs is None else xs)
  else:  # too large to hold every individual's weights: chunks of individuals
    chunk = max(1, (4 << 30) // per_step)
    args = (step_seeds,) if xs is None else (step_seeds, xs)
    out = jax.lax.map(lambda a: individual(a[0], x if xs is None else a[1]), args,
                      batch_size=chunk)
  return out.reshape((pop,) + out.shape[2:])


def pure_jax_gradient_materialised(fitness, seeds, shape, sigma, offset, *, kind):
  """evosax-style: the (pop, n) noise in memory, then one contraction."""
  kind = noise_lib.get_kind(kind)
  hi, lo = noise_lib.block_index(offset, shape)
  high = not noise_lib.fits_32_bits(kind, offset, math.prod(shape))
  noise = jax.vmap(lambda s: noise_lib.noise_at(s, hi, lo, kind, high_word=high))(seeds)
  return jnp.tensordot(fitness, noise, axes=1) / (seeds.shape[0] * sigma)


def pure_jax_gradient_fused(fitness, seeds, shape, sigma, offset, *, kind):
  """The same as a broadcast-multiply-sum, which XLA can fuse into one reduction."""
  kind = noise_lib.get_kind(kind)
  hi, lo = noise_lib.block_index(offset, shape)
  high = not noise_lib.fits_32_bits(kind, offset, math.prod(shape))
  noise = noise_lib.noise_at(seeds[:, None, None], hi[None], lo[None], kind, high_word=high)
  return (fitness[:, None, None] * noise).sum(0) / (seeds.shape[0] * sigma)


def pure_jax_reduce_metric(center, seeds, sigma, offset, *, kind):
  kind = noise_lib.get_kind(kind)
  n = center.shape[0]
  hi, lo = noise_lib.block_index(offset, (n,))
  high = not noise_lib.fits_32_bits(kind, offset, n)

  def individual(seed):
    noise = noise_lib.noise_at(seed, hi, lo, kind, high_word=high)
    return jnp.mean(jnp.abs(center + sigma * noise))

  return jax.vmap(individual)(seeds)


# ----------------------------------------------------------------------------
# Correctness, compiled.


def _run_case(args, results, name, fn, budget):
  """``_harness.run_case`` for the cases whose name contains ``--only`` (all by default)."""
  if args.only is None or args.only in name:
    _harness.run_case(results, name, fn, budget)


def check(args, results, budget):
  impl = args.implementation
  ieee = config_lib.PerturbedLinearConfig(tf32=False)
  configs = {
      "heuristic": None,
      "16x16x32/w2": config_lib.PerturbedLinearConfig(16, 16, 32, 2, tf32=False),
      "32x128x64/w4": config_lib.PerturbedLinearConfig(32, 128, 64, 4, tf32=False),
      "128x64x128/w8": config_lib.PerturbedLinearConfig(128, 64, 128, 8, tf32=False),
  }
  shapes = [(6, 7, 37, 70, True), (6, 5, 33, 64, False), (4, 33, 100, 4500, True)]
  if args.quick:
    shapes = shapes[:2]
    configs = dict(list(configs.items())[:3])

  # 1. Noise bit for bit: identity x exposes N_i; one-hot fitness returns N_i.
  for kind in KINDS if not args.skip_noise_bits else ():
    offsets = (3, 64, 2**32 - 50 if kind == "uniform" else 2**37 - 999)
    if args.high_offsets:
      offsets = (2**32 - 50, 2**37 - 999)
    for offset in offsets:
      def noise_bits(kind=kind, offset=offset):
        pop, out_features, in_features = 4, 19, 45
        seeds = _seeds(offset % 1000, pop)
        eye = jnp.eye(in_features, dtype=F32)
        weight = jnp.zeros((out_features, in_features), F32)
        y = jaxnoise.virtual_perturbed_linear(eye, weight, None, seeds, 1.0, offset, kind=kind,
                                              implementation=impl, config=ieee)
        expected = jaxnoise.virtual_noise(seeds, (out_features, in_features), offset, kind=kind)
        forward_mismatch = int(jnp.sum(jnp.transpose(y, (0, 2, 1)) != expected))
        grad_mismatch = 0
        for member in range(pop):
          one_hot = jnp.zeros((pop,), F32).at[member].set(1.0)
          grad = jaxnoise.virtual_weight_gradient(one_hot, seeds, (out_features, in_features),
                                                  0.25, None, offset, kind=kind,
                                                  implementation=impl)
          grad_mismatch += int(jnp.sum(grad != expected[member]))
        if forward_mismatch or grad_mismatch:
          raise AssertionError(f"noise bits differ: forward {forward_mismatch}, "
                               f"gradient {grad_mismatch}")
        return {"forward_mismatch": forward_mismatch, "gradient_mismatch": grad_mismatch}
      _run_case(args, results, f"check noise bits {kind} offset={offset}", noise_bits, budget)

  if args.high_offsets:
    return

  # 2. Perturbed linear, input gradient: kernel vs reference, several configs.
  if args.skip_linear:
    shapes = []
  tolerances = {"f32": 2e-5, "bf16": 3e-2, "f16": 5e-3}
  for shape_index, (pop, batch, out_features, in_features, shared) in enumerate(shapes):
    for dtype_name in ("f32", "bf16", "f16"):
      for kind in KINDS:
        for antithetic in (False, True):
          for config_name, config in configs.items():
            # Every kind, dtype and antithetic setting with the heuristic tiles on the two
            # small shapes (shared and per-individual x); three more tilings for f32 / bf16,
            # uniform / rademacher, on the shared one; bf16 alone at in = 4500.
            if config_name != "heuristic" and (shape_index != 0 or dtype_name == "f16"
                                               or kind == "normal" or antithetic):
              continue
            if shape_index == 2 and dtype_name != "bf16":
              continue
            if config is None and dtype_name == "f32":
              config = ieee
            name = (f"check linear {pop}x{batch}x{out_features}x{in_features} "
                    f"{'shared' if shared else 'per-ind'} {dtype_name} {kind} "
                    f"anti={antithetic} {config_name}")

            def linear(pop=pop, batch=batch, out_features=out_features,
                       in_features=in_features, shared=shared, dtype_name=dtype_name, kind=kind,
                       antithetic=antithetic, config=config):
              dtype = DTYPES[dtype_name]
              x = _random(1, (batch, in_features) if shared else (pop, batch, in_features), dtype)
              weight = _random(2, (out_features, in_features), F32 if dtype == F32 else dtype)
              bias = _random(3, (out_features,), F32)
              seeds = _seeds(4, pop)
              kw = dict(kind=kind, antithetic=antithetic)
              ref = jaxnoise.virtual_perturbed_linear(x, weight, bias, seeds, 0.05, 11,
                                                      implementation="reference", **kw)
              out = jaxnoise.virtual_perturbed_linear(x, weight, bias, seeds, 0.05, 11,
                                                      implementation=impl, config=config, **kw)
              err = _rel_err(out, ref)
              record = {"rel_err": err, "tol": tolerances[dtype_name]}
              if dtype_name == "f32" and config_name in ("heuristic", "16x16x32/w2"):
                grad_out = _random(5, ref.shape, F32)
                g_ref = pallas_triton_free_input_grad(grad_out, weight, seeds, shared, kw)
                g_out = pallas_triton.perturbed_linear_input_grad(
                    grad_out, weight, seeds, jnp.float32(0.05), 11, kind=noise_lib.get_kind(kind),
                    antithetic=antithetic, shared_x=shared,
                    config=config_lib.PerturbedLinearConfig(tf32=False) if config is None
                    else config, interpret=impl == "interpret")
                record["input_grad_rel_err"] = _rel_err(g_out, g_ref)
                err = max(err, record["input_grad_rel_err"])
              if not err <= tolerances[dtype_name]:
                raise AssertionError(f"rel_err {err} above {tolerances[dtype_name]}")
              return record
            _run_case(args, results, name, linear, budget)

  # 3. Gradient estimates and reduce-metric vs reference.
  for kind in KINDS:
    for antithetic in (False, True):
      for offset in ((5, 2**32 - 300) if antithetic else (5,)):
        def flat_ops(kind=kind, antithetic=antithetic, offset=offset):
          pop = 34
          fitness = _random(6, (pop,), F32)
          seeds = _seeds(7, pop)
          kw = dict(kind=kind, antithetic=antithetic)
          errs = {}
          for name, shape in (("weight", (37, 129)), ("bias", (1000,))):
            fn = (jaxnoise.virtual_weight_gradient if name == "weight"
                  else jaxnoise.virtual_bias_gradient)
            ref = fn(fitness, seeds, shape, 0.1, None, offset, implementation="reference", **kw)
            out = fn(fitness, seeds, shape, 0.1, None, offset, implementation=impl, **kw)
            errs[f"{name}_grad_rel_err"] = _rel_err(out, ref)
          center = _random(8, (5003,), F32)
          ref = jaxnoise.virtual_reduce_metric(center, seeds, 0.3, None, offset,
                                               implementation="reference", **kw)
          out = jaxnoise.virtual_reduce_metric(center, seeds, 0.3, None, offset,
                                               implementation=impl, **kw)
          errs["reduce_metric_rel_err"] = _rel_err(out, ref)
          if max(errs.values()) > 1e-5:
            raise AssertionError(f"errors {errs}")
          return errs
        _run_case(args, results, f"check flat ops {kind} anti={antithetic} offset={offset}",
                  flat_ops, budget)

  # 4. Autotuning with the correctness screen, compiled.
  def tuned():
    from jaxnoise.ops.virtual_noise import tuning  # pylint: disable=g-import-not-at-top
    pop, batch, out_features, in_features = (512, 64, 256, 768) if not args.quick else (4, 5, 40, 70)
    x, weight, bias, seeds = _linear_inputs(pop, batch, out_features, in_features, True,
                                            jnp.bfloat16)
    record = tuning.tune_perturbed_linear(x, weight, bias, seeds, 0.01, kind="rademacher",
                                          implementation=impl, repeats=5)
    return {"selected": dataclasses.asdict(record.selected),
            "candidates": [{"config": dataclasses.asdict(c.config), "status": c.status,
                            "deviation": c.deviation, "ms": None if c.seconds is None
                            else 1e3 * c.seconds, "error": c.error} for c in record.candidates]}
  _run_case(args, results, "check autotune screen", tuned, budget)

  # 5. No (pop, out, in) buffer in the compiled executable.
  def memory():
    pop, batch, out_features, in_features = 256, 8, 512, 512
    x = _random(1, (batch, in_features), jnp.bfloat16)
    weight = _random(2, (out_features, in_features), jnp.bfloat16)
    seeds = _seeds(3, pop)
    fn = jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, implementation=impl))
    stats = fn.lower(x, weight, None, seeds, 0.1).compile().memory_analysis()
    noise_bytes = pop * out_features * in_features * 4
    temp = int(getattr(stats, "temp_size_in_bytes", -1))
    if temp < 0 or temp >= noise_bytes // 8:
      raise AssertionError(f"temp buffer {temp} bytes vs noise {noise_bytes}")
    return {"temp_bytes": temp, "noise_bytes_if_materialised": noise_bytes}
  _run_case(args, results, "check memory analysis", memory, budget)


def pallas_triton_free_input_grad(grad_out, weight, seeds, shared, kw):
  from jaxnoise.ops.virtual_noise import reference  # pylint: disable=g-import-not-at-top
  return reference.perturbed_linear_input_grad_reference(
      grad_out, weight, seeds, jnp.float32(0.05), 11, kind=noise_lib.get_kind(kw["kind"]),
      antithetic=kw["antithetic"], shared_x=shared)


# ----------------------------------------------------------------------------
# Timings.


def _linear_inputs(pop, batch, out_features, in_features, shared, dtype):
  x_shape = (batch, in_features) if shared else (pop, batch, in_features)
  return (_random(1, x_shape, dtype), _random(2, (out_features, in_features), dtype),
          _random(3, (out_features,), F32), _seeds(4, pop))


def time_linear(args, shape, dtype_name, kind, antithetic, config=None, baselines=True):
  name, pop, batch, out_features, in_features, shared = shape
  dtype = DTYPES[dtype_name]
  x, weight, bias, seeds = _linear_inputs(pop, batch, out_features, in_features, shared, dtype)
  kw = dict(kind=kind, antithetic=antithetic)
  kernel = jax.jit(functools.partial(jaxnoise.virtual_perturbed_linear, offset=0,
                                     implementation=args.implementation, config=config, **kw))
  record = {"shape": name, "dtype": dtype_name, "kind": kind, "antithetic": antithetic,
            "config": None if config is None else dataclasses.asdict(config)}
  record["kernel_ms"] = 1e3 * _harness.median_time(kernel, x, weight, bias, seeds, 0.01)
  record["noise_values_per_s"] = pop * out_features * in_features / record["kernel_ms"] * 1e3
  if baselines:
    pure = jax.jit(functools.partial(pure_jax_linear, offset=0, **kw))
    try:
      record["pure_jax_ms"] = 1e3 * _harness.median_time(pure, x, weight, bias, seeds, 0.01)
      record["speedup_vs_pure_jax"] = record["pure_jax_ms"] / record["kernel_ms"]
    except Exception as error:  # pylint: disable=broad-except
      record["pure_jax_error"] = f"{type(error).__name__}: {error}"[:300]
    rows = _random(5, (pop * batch, in_features), dtype)
    floor = jax.jit(lambda a, w: jnp.dot(a, w.T, preferred_element_type=F32))
    record["gemm_floor_ms"] = 1e3 * _harness.median_time(floor, rows, weight)
    record["ratio_to_floor"] = record["kernel_ms"] / record["gemm_floor_ms"]
  return record


def time_gradient(args, pop, shape, kind, antithetic, config=None, baselines=True):
  fitness = _random(6, (pop,), F32)
  seeds = _seeds(7, pop)
  kw = dict(kind=kind, antithetic=antithetic)
  kernel = jax.jit(functools.partial(jaxnoise.virtual_weight_gradient, weight_shape=shape,
                                     sigma=0.1, implementation=args.implementation,
                                     config=config, **kw))
  n = math.prod(shape)
  record = {"pop": pop, "shape": list(shape), "kind": kind, "antithetic": antithetic,
            "config": None if config is None else dataclasses.asdict(config)}
  record["kernel_ms"] = 1e3 * _harness.median_time(kernel, fitness, seeds)
  record["noise_values_per_s"] = pop * n / record["kernel_ms"] * 1e3
  if baselines and not antithetic:
    for label, fn in (("materialised", pure_jax_gradient_materialised),
                      ("fused", pure_jax_gradient_fused)):
      if label == "materialised" and pop * n * 4 > (32 << 30):
        continue
      pure = jax.jit(functools.partial(fn, shape=shape, sigma=0.1, offset=0, kind=kind))
      try:
        record[f"pure_jax_{label}_ms"] = 1e3 * _harness.median_time(pure, fitness, seeds)
      except Exception as error:  # pylint: disable=broad-except
        record[f"pure_jax_{label}_error"] = f"{type(error).__name__}: {error}"[:300]
    best = min([v for k, v in record.items() if k.startswith("pure_jax_") and k.endswith("_ms")],
               default=None)
    if best:
      record["speedup_vs_pure_jax"] = best / record["kernel_ms"]
  return record


def time_reduce_metric(args, pop, n_params, kind, antithetic, config=None, baselines=True):
  center = _random(8, (n_params,), F32)
  seeds = _seeds(9, pop)
  kw = dict(kind=kind, antithetic=antithetic)
  kernel = jax.jit(functools.partial(jaxnoise.virtual_reduce_metric, sigma=0.1,
                                     implementation=args.implementation, config=config, **kw))
  record = {"pop": pop, "n_params": n_params, "kind": kind, "antithetic": antithetic,
            "config": None if config is None else dataclasses.asdict(config)}
  record["kernel_ms"] = 1e3 * _harness.median_time(kernel, center, seeds)
  record["noise_values_per_s"] = pop * n_params / record["kernel_ms"] * 1e3
  if baselines and not antithetic:
    pure = jax.jit(functools.partial(pure_jax_reduce_metric, sigma=0.1, offset=0, kind=kind))
    record["pure_jax_ms"] = 1e3 * _harness.median_time(pure, center, seeds)
    record["speedup_vs_pure_jax"] = record["pure_jax_ms"] / record["kernel_ms"]
  return record


def sweep(args, results, budget):
  linear_configs = [
      config_lib.PerturbedLinearConfig(64, 64, 64, 4),
      config_lib.PerturbedLinearConfig(64, 64, 64, 8),
      config_lib.PerturbedLinearConfig(64, 128, 64, 8),
      config_lib.PerturbedLinearConfig(64, 64, 128, 4),
      config_lib.PerturbedLinearConfig(64, 128, 32, 4),
      config_lib.PerturbedLinearConfig(64, 32, 64, 4),
      config_lib.PerturbedLinearConfig(64, 128, 128, 8),
      config_lib.PerturbedLinearConfig(128, 64, 64, 8),
      config_lib.PerturbedLinearConfig(128, 128, 64, 8),
      config_lib.PerturbedLinearConfig(64, 64, 64, 4, num_stages=2),
  ]
  shapes = [LINEAR_SHAPES[0], LINEAR_SHAPES[2]]
  if args.quick:
    shapes, linear_configs = QUICK_LINEAR_SHAPES[:1], linear_configs[:2]
  for shape in shapes:
    for kind in ("uniform", "rademacher"):
      for config in linear_configs:
        if config.block_batch > max(16, config_lib.next_pow2(shape[2])) and config.block_batch > 64:
          continue
        _run_case(
            args, results, f"sweep linear {shape[0]} bf16 {kind} {config}",
            functools.partial(time_linear, args, shape, "bf16", kind, False, config, False),
            budget)
  grad_configs = [config_lib.NoiseGradientConfig(r, s, w) for r, s, w in
                  ((32, None, 4), (64, None, 4), (128, None, 4), (64, None, 8), (64, 4, 4),
                   (64, 16, 4))]
  grad_configs += [config_lib.NoiseGradientConfig(r, None, w, individuals_per_step=u,
                                                  lane_accumulators=True)
                   for r, w, u in ((128, 4, 1), (128, 4, 2), (256, 8, 2), (64, 2, 2))]
  pop, shape = (1024, (1024, 1024)) if not args.quick else (8, (40, 70))
  if args.quick:
    grad_configs = grad_configs[:1] + grad_configs[-1:]
  for kind in ("uniform", "rademacher"):
    for config in grad_configs:
      if config.pop_splits is None:
        config = dataclasses.replace(
            config, pop_splits=config_lib.noise_gradient_heuristics(math.prod(shape),
                                                                    pop).pop_splits)
      _run_case(args, results, f"sweep gradient {pop}x{shape} {kind} {config}",
                functools.partial(time_gradient, args, pop, shape, kind, False, config, False),
                budget)
  metric_configs = [config_lib.ReduceMetricConfig(r, g, None, w) for r, g, w in
                    ((32, 4, 4), (16, 4, 4), (64, 4, 8), (32, 8, 4), (32, 2, 4), (32, 1, 4))]
  pop, n_params = (1024, 1 << 20) if not args.quick else (8, 3000)
  if args.quick:
    metric_configs = metric_configs[:2]
  for kind in ("uniform", "rademacher"):
    for config in metric_configs:
      _run_case(args, results, f"sweep reduce-metric {pop}x{n_params} {kind} {config}",
                functools.partial(time_reduce_metric, args, pop, n_params, kind, False, config,
                                  False), budget)


def bench(args, results, budget):
  shapes = QUICK_LINEAR_SHAPES if args.quick else LINEAR_SHAPES
  for shape in shapes:
    for dtype_name in ("bf16", "f32"):
      for kind in KINDS:
        for antithetic in (False, True):
          if dtype_name == "f32" and (antithetic or kind == "normal") and not args.all_baselines:
            continue
          baselines = kind == "uniform" and not antithetic or args.all_baselines
          _run_case(
              args, results, f"linear {shape[0]} {dtype_name} {kind} anti={antithetic}",
              functools.partial(time_linear, args, shape, dtype_name, kind, antithetic, None,
                                baselines), budget)
  grad_cases = [(1024, (1024, 1024)), (4096, (256, 768))] if not args.quick else [(8, (40, 70))]
  for pop, shape in grad_cases:
    for kind in KINDS:
      for antithetic in (False, True):
        _run_case(args, results, f"gradient {pop}x{shape} {kind} anti={antithetic}",
                  functools.partial(time_gradient, args, pop, shape, kind, antithetic), budget)
  metric_cases = [(1024, 1 << 20)] if not args.quick else [(8, 3000)]
  for pop, n_params in metric_cases:
    for kind in KINDS:
      for antithetic in (False, True):
        _run_case(
            args, results, f"reduce-metric {pop}x{n_params} {kind} anti={antithetic}",
            functools.partial(time_reduce_metric, args, pop, n_params, kind, antithetic),
            budget)


def throughput(args, results, budget):
  """Noise values/s of every kind: bf16 forward and weight gradient at the same shapes.

  Antithetic pairs only on the first shape; no baselines (ratios between kinds,
  one run).
  """
  shapes = QUICK_LINEAR_SHAPES[:1] if args.quick else THROUGHPUT_SHAPES
  for index, shape in enumerate(shapes):
    _, pop, _, out_features, in_features, _ = shape
    for antithetic in (False, True) if index == 0 else (False,):
      for kind in KINDS:
        _run_case(args, results, f"throughput linear {shape[0]} bf16 {kind} anti={antithetic}",
                  functools.partial(time_linear, args, shape, "bf16", kind, antithetic, None,
                                    False), budget)
        _run_case(args, results,
                  f"throughput gradient {pop}x({out_features}, {in_features}) {kind} "
                  f"anti={antithetic}",
                  functools.partial(time_gradient, args, pop, (out_features, in_features), kind,
                                    antithetic, None, False), budget)


def summarise(results):
  linear = [r for r in results if r.get("case", "").startswith("linear") and "kernel_ms" in r]
  if linear:
    print(_harness.table(linear, ["shape", "dtype", "kind", "antithetic", "kernel_ms",
                                  "pure_jax_ms", "gemm_floor_ms", "speedup_vs_pure_jax",
                                  "ratio_to_floor", "noise_values_per_s"]))
  flat = [r for r in results if r.get("case", "").startswith(("gradient", "reduce"))
          and "kernel_ms" in r]
  if flat:
    print(_harness.table(flat, ["case", "kernel_ms", "pure_jax_ms", "pure_jax_fused_ms",
                                "pure_jax_materialised_ms", "speedup_vs_pure_jax",
                                "noise_values_per_s"]))
  kinds = [r for r in results if r.get("case", "").startswith("throughput") and "kernel_ms" in r]
  if kinds:
    print(_harness.table(kinds, ["case", "kernel_ms", "noise_values_per_s"]))
  sweeps = [r for r in results if r.get("case", "").startswith("sweep") and "kernel_ms" in r]
  if sweeps:
    print(_harness.table(sweeps, ["case", "kernel_ms", "noise_values_per_s"]))
  failures = [r for r in results if "error" in r]
  print(f"{len(results)} cases, {len(failures)} errors")
  for r in failures:
    print("ERROR", r["case"], r["error"][:300])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--check", action="store_true", help="compiled correctness checks")
  parser.add_argument("--sweep", action="store_true", help="config sweeps")
  parser.add_argument("--bench", action="store_true", help="SPEC section 5 benchmarks")
  parser.add_argument("--throughput", action="store_true",
                      help="values/s of every kind, forward and gradient (THROUGHPUT_SHAPES)")
  parser.add_argument("--quick", action="store_true", help="tiny shapes (CPU interpret mode)")
  parser.add_argument("--skip-noise-bits", action="store_true",
                      help="skip the noise bit-for-bit checks (identity x, one-hot fitness)")
  parser.add_argument("--only", default=None,
                      help="only the cases whose name contains this text")
  parser.add_argument("--skip-linear", action="store_true",
                      help="--check without the perturbed-linear cases (section 2)")
  parser.add_argument("--high-offsets", action="store_true",
                      help="check the noise bits at offsets near 2**32 and 2**37 only")
  parser.add_argument("--all-baselines", action="store_true",
                      help="time the pure-JAX baseline for every kind and antithetic setting")
  parser.add_argument("--budget", type=float, default=480.0, help="seconds before skipping")
  parser.add_argument("--out", default="benchmarks/out")
  parser.add_argument("--tag", default="virtual_noise", help="JSON file name (without .json)")
  parser.add_argument("--plot", action="store_true", help="plot the JSON in --out and exit")
  args = parser.parse_args(argv)
  if args.plot:
    plot(args.out)
    return
  if not (args.check or args.sweep or args.bench or args.throughput):
    args.check = args.bench = True
  args.implementation = "pallas" if jax.default_backend() == "gpu" else "interpret"
  budget = _harness.Budget(args.budget)
  results = []
  facts = _harness.device_facts()
  print(facts, flush=True)
  if args.check:
    check(args, results, budget)
  if args.sweep:
    sweep(args, results, budget)
  if args.bench:
    bench(args, results, budget)
  if args.throughput:
    throughput(args, results, budget)
  _harness.write_json(os.path.join(args.out, f"{args.tag}.json"),
                      {"facts": facts, "results": results})
  summarise(results)


def plot(out_dir):
  import json  # pylint: disable=g-import-not-at-top
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  with open(os.path.join(out_dir, "virtual_noise.json")) as f:
    payload = json.load(f)
  rows = [r for r in payload["results"] if r.get("case", "").startswith("linear")
          and "kernel_ms" in r and not r["antithetic"]]
  labels = sorted({(r["shape"], r["dtype"]) for r in rows})
  fig, ax = plt.subplots(figsize=(13, 6))
  width = 0.15
  series = [("pure JAX", lambda r: r.get("pure_jax_ms")),
            ("GEMM floor", lambda r: r.get("gemm_floor_ms"))] + [
                (f"kernel {k}", (lambda k: lambda r: r["kernel_ms"] if r["kind"] == k else None)(k))
                for k in KINDS]
  for index, (label, getter) in enumerate(series):
    values = []
    for shape, dtype in labels:
      candidates = [getter(r) for r in rows if r["shape"] == shape and r["dtype"] == dtype]
      candidates = [c for c in candidates if c is not None]
      values.append(min(candidates) if candidates else 0.0)
    ax.bar(np.arange(len(labels)) + index * width, values, width, label=label)
  ax.set_xticks(np.arange(len(labels)) + 2 * width)
  ax.set_xticklabels([f"{s} {d}" for s, d in labels], fontsize=7, rotation=25, ha="right")
  ax.set_yscale("log")
  ax.set_ylabel("ms (median)")
  ax.set_title(f"virtual_perturbed_linear, {payload['facts']['device']}, "
               f"jax {payload['facts']['jax']}")
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(out_dir, "virtual_noise.png"), dpi=120)


if __name__ == "__main__":
  main()
