"""Autotuning entry points of the virtual-noise ops.

Call one of these once, outside ``jit``, on representative concrete inputs;
afterwards the op picks the tuned config for inputs of the same shapes,
dtypes and options (see :mod:`jaxnoise.ops.autotune` for the screen).

Example:
  >>> import jax, jax.numpy as jnp
  >>> import jaxnoise
  >>> from jaxnoise.ops.virtual_noise import tuning
  >>> x, w = jnp.ones((4, 40)), jnp.ones((24, 40))
  >>> seeds = jnp.arange(2, dtype=jnp.uint32)
  >>> record = tuning.tune_perturbed_linear(x, w, None, seeds, 0.1,
  ...     implementation="interpret", candidates=[None], repeats=1)
  >>> record.selected is not None
  True
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _common
from jaxnoise.ops import autotune
from jaxnoise.ops.virtual_noise import api
from jaxnoise.ops.virtual_noise import config as config_lib

__all__ = ["tune_perturbed_linear", "tune_reduce_metric", "tune_weight_gradient"]

# Accepted deviation from the float32 reference, by input dtype: float32
# inputs go through TF32 matrix units by default (about 1e-3 relative).
_TOLERANCE = {
    jnp.dtype(jnp.float32): 5e-3,
    jnp.dtype(jnp.bfloat16): 3e-2,
    jnp.dtype(jnp.float16): 1e-2,
}


def _kernel_implementation(implementation: str) -> str:
  implementation = _common.resolve_implementation(implementation)
  if implementation == "reference":
    raise ValueError('the reference has nothing to tune: use implementation="pallas" (GPU) '
                     'or "interpret"')
  return implementation


def _resolve_candidates(candidates, heuristic):
  """``None`` entries stand for the heuristic config."""
  return [heuristic if c is None else c for c in candidates]


def tune_perturbed_linear(x, weight, bias, seeds, sigma, offset: int = 0, *,
                          kind: str = noise_lib.DEFAULT_KIND, antithetic: bool = False,
                          implementation: str = "auto", out_dtype: Any = jnp.float32,
                          candidates: Sequence[Any] | None = None,
                          tolerance: float | None = None,
                          repeats: int = 10) -> autotune.TuningRecord:
  """Tune :func:`jaxnoise.virtual_perturbed_linear` for these inputs' shapes and options.

  Args:
    x, weight, bias, seeds, sigma, offset, kind, antithetic, out_dtype: as for
      the op (concrete arrays).
    implementation: ``"auto"``, ``"pallas"`` or ``"interpret"``.
    candidates: configs to try (None: the heuristic and its neighbours;
      a None entry stands for the heuristic).
    tolerance: accepted deviation from the reference (None: by dtype).
    repeats: timed samples per candidate (each queues calls, see
      :mod:`jaxnoise.ops.autotune`).

  Returns:
    The tuning record (every candidate with its deviation and time).
  """
  implementation = _kernel_implementation(implementation)
  kind_ = noise_lib.get_kind(kind)
  seeds = noise_lib.as_seeds(seeds)
  out_features, in_features = weight.shape
  products = 2 if antithetic and x.ndim == 3 else 1
  heuristic = config_lib.perturbed_linear_heuristics(x.shape[-2], out_features, in_features,
                                                     kind_, products)
  if candidates is None:
    candidates = config_lib.perturbed_linear_candidates(x.shape[-2], out_features, in_features,
                                                        kind_, products)
  candidates = _resolve_candidates(candidates, heuristic)
  op = functools.partial(api.virtual_perturbed_linear, offset=offset, kind=kind,
                         antithetic=antithetic, out_dtype=out_dtype)
  compiled = {}

  def run(config):
    if config not in compiled:
      compiled[config] = jax.jit(functools.partial(op, implementation=implementation,
                                                   config=config))
    return compiled[config](x, weight, bias, seeds, sigma)

  key = config_lib.perturbed_linear_key(
      implementation, x.shape, x.dtype, weight.shape, weight.dtype, bias is not None,
      seeds.shape[0], kind_, antithetic, offset, jnp.dtype(out_dtype))
  return autotune.tune(
      key[0], key, candidates, run,
      lambda: op(x, weight, bias, seeds, sigma, implementation="reference"),
      _TOLERANCE[jnp.dtype(x.dtype)] if tolerance is None else tolerance, repeats=repeats)


def tune_weight_gradient(fitness, seeds, shape, sigma, offset: int = 0, *,
                         kind: str = noise_lib.DEFAULT_KIND, antithetic: bool = False,
                         implementation: str = "auto", candidates: Sequence[Any] | None = None,
                         tolerance: float = 1e-5, repeats: int = 10) -> autotune.TuningRecord:
  """Tune the gradient estimate (:func:`jaxnoise.virtual_weight_gradient` and
  :func:`jaxnoise.virtual_bias_gradient`, which share the kernel) for ``shape``."""
  implementation = _kernel_implementation(implementation)
  kind_ = noise_lib.get_kind(kind)
  seeds = noise_lib.as_seeds(seeds)
  shape = tuple(int(d) for d in shape)
  n_individuals = seeds.shape[0] // 2 if antithetic else seeds.shape[0]
  n_elements = math.prod(shape)
  heuristic = config_lib.noise_gradient_heuristics(n_elements, n_individuals, kind_)
  if candidates is None:
    candidates = config_lib.noise_gradient_candidates(n_elements, n_individuals, kind_)
  candidates = _resolve_candidates(candidates, heuristic)
  fn = api.virtual_weight_gradient if len(shape) == 2 else api.virtual_bias_gradient
  op = functools.partial(fn, seeds=seeds, sigma=sigma, offset=offset, kind=kind,
                         antithetic=antithetic)
  op_shape = shape if len(shape) == 2 else shape[0]
  compiled = {}

  def run(config):
    if config not in compiled:
      compiled[config] = jax.jit(lambda f, config=config: op(
          f, **{"weight_shape" if len(shape) == 2 else "bias_shape": op_shape},
          implementation=implementation, config=config))
    return compiled[config](fitness)

  def reference():
    return op(fitness, **{"weight_shape" if len(shape) == 2 else "bias_shape": op_shape},
              implementation="reference")

  key = config_lib.noise_gradient_key(implementation, seeds.shape[0], shape, kind_, antithetic,
                                      offset)
  return autotune.tune(key[0], key, candidates, run, reference, tolerance, repeats=repeats)


def tune_reduce_metric(center, seeds, sigma, offset: int = 0, *,
                       kind: str = noise_lib.DEFAULT_KIND, antithetic: bool = False,
                       implementation: str = "auto", candidates: Sequence[Any] | None = None,
                       tolerance: float = 1e-5, repeats: int = 10) -> autotune.TuningRecord:
  """Tune :func:`jaxnoise.virtual_reduce_metric` for these inputs' shapes and options."""
  implementation = _kernel_implementation(implementation)
  kind_ = noise_lib.get_kind(kind)
  seeds = noise_lib.as_seeds(seeds)
  n_individuals = seeds.shape[0] // 2 if antithetic else seeds.shape[0]
  heuristic = config_lib.reduce_metric_heuristics(center.shape[0], n_individuals, kind_)
  if candidates is None:
    candidates = config_lib.reduce_metric_candidates(center.shape[0], n_individuals, kind_)
  candidates = _resolve_candidates(candidates, heuristic)
  op = functools.partial(api.virtual_reduce_metric, sigma=sigma, offset=offset, kind=kind,
                         antithetic=antithetic)
  compiled = {}

  def run(config):
    if config not in compiled:
      compiled[config] = jax.jit(functools.partial(op, implementation=implementation,
                                                   config=config))
    return compiled[config](center, seeds)

  key = config_lib.reduce_metric_key(implementation, seeds.shape[0], center.shape[0], kind_,
                                     antithetic, offset)
  return autotune.tune(key[0], key, candidates, run,
                       lambda: op(center, seeds, implementation="reference"), tolerance,
                       repeats=repeats)
