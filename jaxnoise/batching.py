"""Per-individual virtual-noise functions whose ``jax.vmap`` is one batched op.

An ES population is naturally written for *one* individual and vmapped over
seeds::

    def logits(seed):                      # one individual
      h = perturbed_linear(x, w1, b1, seed, sigma, offset=0)
      return perturbed_linear(jax.nn.relu(h), w2, b2, seed, sigma, offset=o2)

    jax.vmap(logits)(seeds)                # the whole population

The functions here are wrapped in :func:`jax.custom_batching.custom_vmap`, so
``jax.vmap`` over ``seed`` does not add a batch dimension to a per-individual
computation: it becomes **one call** of the batched op
(:func:`jaxnoise.virtual_perturbed_linear`, one kernel launch). In the example
the first layer's ``x`` is shared by the population (the op's shared-``x``
path: ``x`` is read once) and the second layer's input is per individual.

vmap rule (``in_batched`` patterns), for the linear
---------------------------------------------------
* ``seed`` batched (``x`` shared or batched), ``weight``/``bias``/``sigma``
  not batched: one batched op call; a batched ``x`` becomes the op's
  per-individual ``x``. Nested ``vmap`` over seeds (``vmap`` of ``vmap``)
  flattens the seed axes into one population, still one call.
* only ``x`` batched (e.g. ``vmap`` over examples inside or outside the
  ``vmap`` over seeds): the new axis joins ``x``'s leading (batch) dimensions;
  no extra call.
* ``weight``, ``bias`` or ``sigma`` batched (several models, a sigma sweep):
  falls back to ``jax.vmap`` of the plain per-individual computation, which is
  correct for every pattern (a Pallas kernel then gets a grid axis from
  ``pallas_call``'s own batching rule).

Each rule output calls the custom-vmap function again, so the rules compose
under any number and order of ``vmap`` and ``jit``.

Antithetic pairs
----------------
A single individual has no partner, so :func:`perturbed_linear` always uses
``+sigma``. An antithetic *pair* is its own unit: :func:`perturbed_linear_pair`
evaluates both members of the pair that shares ``seed`` (signs ``+1``, ``-1``)
and returns them stacked on a leading axis of 2; ``jax.vmap`` over pair seeds
is one op call with ``antithetic=True`` (the kernel generates each noise tile
once for both members). :func:`jaxnoise.nn.population.population_apply` uses
the same machinery for whole models.

Differentiation
---------------
``custom_vmap`` has no reverse mode, so each function is a ``jax.custom_vjp``
*around* the ``custom_vmap`` (static configuration is closed over first). The
backward pass is the VJP of the plain computation, i.e. the op's own custom
VJP that regenerates the noise; ``jax.grad``, ``jax.vmap(jax.grad(...))`` and
``jax.grad(... jax.vmap ...)`` work. Forward mode (``jax.jvp``) is not
supported, as for any ``custom_vjp`` function.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _common
from jaxnoise.ops.virtual_noise import api as ops

__all__ = [
    "individual_noise",
    "perturb",
    "perturbed_linear",
    "perturbed_linear_pair",
    "reduce_metric",
]


# ----------------------------------------------------------------------------
# Validation.


def as_seed(seed: Any, name: str = "seed") -> jax.Array:
  """Validate one individual's seed: an integer scalar, returned as uint32.

  Signed and 64-bit integers wrap modulo 2**32 (as :func:`jaxnoise.as_seeds`);
  floats and booleans raise ``TypeError``; non-scalars raise ``ValueError``.

  Example:
    >>> int(as_seed(-1))
    4294967295
  """
  if isinstance(seed, (bool, np.bool_)):
    raise TypeError(f"{name} must be an integer scalar, got bool")
  if isinstance(seed, (int, np.integer)):
    return jnp.asarray(np.asarray(int(seed) & 0xFFFFFFFF, np.uint32))
  dtype = getattr(seed, "dtype", None)
  if dtype is None:
    seed = np.asarray(seed)
    dtype = seed.dtype
  if jnp.dtype(dtype) == jnp.bool_ or not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(f"{name} must be an integer scalar (uint32 preferred), got "
                    f"{_common.describe(seed)}")
  if np.ndim(seed) != 0:
    raise ValueError(f"{name} must be a scalar (one individual; vmap over seeds for a "
                     f"population), got {_common.describe(seed)}")
  if isinstance(seed, np.ndarray):
    return jnp.asarray(seed.astype(np.uint32))
  return jax.lax.convert_element_type(seed, jnp.uint32)


def _check_linear_args(x, weight, bias, *, x_leading: int = 0):
  weight = _common.check_float_array(weight, "weight", (2,))
  x = _common.check_float_array(x, "x", tuple(range(1 + x_leading, 8)))
  out_features, in_features = weight.shape
  if x.shape[-1] != in_features:
    raise ValueError(
        f"x's last dimension must equal weight's in_features={in_features}; "
        f"x {_common.describe(x)}, weight {_common.describe(weight)}")
  if bias is not None:
    bias = _common.check_float_array(bias, "bias", (1,))
    if bias.shape != (out_features,):
      raise ValueError(f"bias must have shape ({out_features},) to match weight "
                       f"{weight.shape}, got {_common.describe(bias)}")
  return x, weight, bias


# ----------------------------------------------------------------------------
# The population-level linear: the one custom_vmap every linear entry point
# reduces to.


@dataclasses.dataclass(frozen=True)
class _LinearSpec:
  """Static configuration of a population-level perturbed linear.

  ``shared_x``: ``x`` is ``(*lead, in)`` for every individual; otherwise
  ``(pop, *lead, in)``. ``antithetic``: the population is made of consecutive
  pairs (the op's convention).
  """

  offset: int
  kind: noise_lib.NoiseKind
  antithetic: bool
  shared_x: bool
  implementation: str
  config: Any
  out_dtype: Any
  rank: int | None = None


def _population_linear_body(spec: _LinearSpec, x, weight, bias, seeds, sigma):
  """``(pop, *lead, out)``: the batched op with ``x``'s leading dims flattened."""
  out_features, in_features = weight.shape
  pop = seeds.shape[0]
  if spec.shared_x:
    lead = x.shape[:-1]
    rows = x.reshape(math.prod(lead), in_features)
  else:
    lead = x.shape[1:-1]
    rows = x.reshape(pop, math.prod(lead), in_features)
  y = ops.virtual_perturbed_linear(
      rows, weight, bias, seeds, sigma, spec.offset, kind=spec.kind,
      antithetic=spec.antithetic, implementation=spec.implementation, config=spec.config,
      out_dtype=spec.out_dtype, rank=spec.rank)
  return y.reshape((pop,) + lead + (out_features,))


def _is_batched(flag) -> bool:
  return bool(flag) if flag is not None else False


def _fallback_vmap(body, in_batched, args):
  """``jax.vmap`` of the plain computation: correct for every batching pattern."""
  in_axes = tuple(0 if _is_batched(b) else None for b in in_batched)
  return jax.vmap(body, in_axes=in_axes)(*args), True


def _population_linear_rule(spec: _LinearSpec, axis_size, in_batched, x, weight, bias, seeds,
                            sigma):
  x_b, weight_b, bias_b, seeds_b, sigma_b = map(_is_batched, in_batched)
  fn = _population_linear(spec)
  if weight_b or bias_b or sigma_b:
    # Per-individual weights or sigma: no batched op covers this.
    return _fallback_vmap(functools.partial(_population_linear_body, spec), in_batched,
                          (x, weight, bias, seeds, sigma))
  if seeds_b:
    # A vmapped population of populations: one population of axis_size * pop
    # (consecutive, so antithetic pairs stay aligned).
    pop = seeds.shape[1]
    flat_seeds = seeds.reshape(axis_size * pop)
    if spec.shared_x and not x_b:
      y = fn(x, weight, bias, flat_seeds, sigma)
    else:
      if spec.shared_x:  # one x per outer element, shared by its pop individuals
        per_individual = jnp.broadcast_to(x[:, None], (axis_size, pop) + x.shape[1:])
      elif x_b:
        per_individual = x
      else:
        per_individual = jnp.broadcast_to(x[None], (axis_size,) + x.shape)
      per_individual = per_individual.reshape((axis_size * pop,) + per_individual.shape[2:])
      y = _population_linear(dataclasses.replace(spec, shared_x=False))(
          per_individual, weight, bias, flat_seeds, sigma)
    return y.reshape((axis_size, pop) + y.shape[1:]), True
  if x_b:
    # Only x batched: the new axis is one more leading (batch) dimension.
    if spec.shared_x:
      y = fn(x, weight, bias, seeds, sigma)  # (pop, axis, *lead, out)
    else:
      y = fn(jnp.moveaxis(x, 0, 1), weight, bias, seeds, sigma)
    return jnp.moveaxis(y, 1, 0), True
  # Nothing batched at this level (reached through custom_vmap's JVP rule).
  return fn(x, weight, bias, seeds, sigma), False


@functools.lru_cache(maxsize=None)
def _population_linear(spec: _LinearSpec):
  """``custom_vjp(custom_vmap(body))`` for one static configuration."""
  return _batched_and_differentiable(spec, _population_linear_body, _population_linear_rule)


def _batched_and_differentiable(spec, body_fn, rule_fn):
  """``custom_vjp(custom_vmap(body))`` with ``body_fn`` / ``rule_fn`` bound to ``spec``.

  The custom_vmap function and ``body`` compute the same values; the forward
  pass keeps the custom batching, the backward pass is the VJP of the plain
  computation (the ops' own custom VJPs regenerate the noise).
  """
  # The public entry points check their arguments; checkify checks cannot run
  # inside custom_vmap, so the bodies trace without them.
  body = _common.without_runtime_checks(functools.partial(body_fn, spec))
  batched = jax.custom_batching.custom_vmap(body)
  batched.def_vmap(_common.without_runtime_checks(functools.partial(rule_fn, spec)))
  differentiable = jax.custom_vjp(batched)

  def forward(*args):
    return batched(*args), args

  def backward(args, grad_out):
    _, vjp = jax.vjp(body, *args)
    return vjp(grad_out)

  differentiable.defvjp(forward, backward)
  return differentiable


def _linear_spec(offset, kind, antithetic, shared_x, implementation, config, out_dtype,
                 rank=None):
  return _LinearSpec(
      offset=noise_lib.check_offset(offset),
      kind=noise_lib.get_kind(kind),
      antithetic=bool(antithetic),
      shared_x=bool(shared_x),
      implementation=_common.resolve_implementation(implementation),
      config=config,
      out_dtype=_common.check_out_dtype(out_dtype),
      rank=noise_lib.check_rank(rank),
  )


def perturbed_linear(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    seed: Any,
    sigma: float | jax.Array,
    offset: int = 0,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    implementation: str = "auto",
    config: Any = None,
    out_dtype: Any = jnp.float32,
    rank: int | None = None,
) -> jax.Array:
  """One individual's perturbed linear layer; ``jax.vmap`` over seeds is one op call.

  ``y = x @ (W + sigma N)^T + (b + sigma nb)`` with ``N``, ``nb`` the virtual
  noise of ``seed`` (weight element ``(j, k)`` at index ``offset + j*in + k``,
  bias element ``j`` at ``offset + out*in + j``): exactly one row of
  :func:`jaxnoise.virtual_perturbed_linear`. The sign is always ``+1``; use
  :func:`perturbed_linear_pair` for antithetic pairs.

  Args:
    x: ``(*lead, in)`` input (any number of leading dims, including none).
    weight: ``(out, in)`` weight.
    bias: ``(out,)`` or None.
    seed: the individual's integer seed (a scalar; vmap over ``(pop,)`` seeds).
    sigma: positive perturbation standard deviation (scalar).
    offset: element index of ``weight[0, 0]`` (Python int).
    kind: noise kind.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.
    config: hashable kernel config or None.
    out_dtype: output dtype.
    rank: None (full-rank noise) or a positive int: the low-rank noise
      ``A B^T / sqrt(rank)`` of :func:`jaxnoise.virtual_perturbed_linear`.

  Returns:
    ``(*lead, out)`` array of ``out_dtype``.

  Example:
    >>> import jax, jax.numpy as jnp, jaxnoise
    >>> x, w = jnp.ones((3, 8)), jnp.zeros((4, 8))
    >>> seeds = jnp.arange(5, dtype=jnp.uint32)
    >>> population = jax.vmap(lambda s: perturbed_linear(x, w, None, s, 0.1))(seeds)
    >>> population.shape
    (5, 3, 4)
    >>> bool(jnp.allclose(population, jaxnoise.virtual_perturbed_linear(x, w, None, seeds, 0.1)))
    True
  """
  x, weight, bias = _check_linear_args(x, weight, bias)
  seed = as_seed(seed)
  sigma = _common.check_sigma(sigma)
  spec = _linear_spec(offset, kind, False, True, implementation, config, out_dtype, rank)
  return _population_linear(spec)(x, weight, bias, seed[None], sigma)[0]


def perturbed_linear_pair(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    seed: Any,
    sigma: float | jax.Array,
    offset: int = 0,
    *,
    per_member_x: bool = False,
    kind: str = noise_lib.DEFAULT_KIND,
    implementation: str = "auto",
    config: Any = None,
    out_dtype: Any = jnp.float32,
    rank: int | None = None,
) -> jax.Array:
  """Both members of an antithetic pair; ``jax.vmap`` over pair seeds is one op call.

  Member 0 uses ``W + sigma N``, member 1 ``W - sigma N`` (``N`` the noise of
  ``seed``), as individuals ``2m`` and ``2m + 1`` of
  :func:`jaxnoise.virtual_perturbed_linear` with ``antithetic=True``. Under
  ``jax.vmap`` over ``(pairs,)`` seeds the result is the op's
  ``(pairs, 2, *lead, out)`` population in pair order.

  Args:
    x: ``(*lead, in)`` shared by both members, or ``(2, *lead, in)`` (one per
      member) when ``per_member_x`` is True.
    weight: ``(out, in)`` weight.
    bias: ``(out,)`` or None.
    seed: the pair's integer seed (scalar).
    sigma: positive perturbation standard deviation.
    offset: element index of ``weight[0, 0]``.
    per_member_x: ``x`` has a leading axis of 2, one input per member.
    kind: noise kind.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.
    config: hashable kernel config or None.
    out_dtype: output dtype.
    rank: None (full-rank noise) or a positive int (low-rank noise).

  Returns:
    ``(2, *lead, out)``: ``[+sigma member, -sigma member]``.

  Example:
    >>> import jax.numpy as jnp
    >>> x, w = jnp.ones((3, 8)), jnp.zeros((4, 8))
    >>> plus, minus = perturbed_linear_pair(x, w, None, 7, 0.1)
    >>> bool(jnp.allclose(plus, -minus))
    True
  """
  x, weight, bias = _check_linear_args(x, weight, bias, x_leading=int(bool(per_member_x)))
  if per_member_x and x.shape[0] != 2:
    raise ValueError(f"per_member_x=True needs x with a leading axis of 2 (one input per "
                     f"pair member), got {_common.describe(x)}")
  seed = as_seed(seed)
  sigma = _common.check_sigma(sigma)
  spec = _linear_spec(offset, kind, True, not per_member_x, implementation, config, out_dtype,
                      rank)
  return _population_linear(spec)(x, weight, bias, jnp.stack([seed, seed]), sigma)


# ----------------------------------------------------------------------------
# One member of an antithetic population with a traced sign (used by
# jaxnoise.nn.population.population_apply, which guarantees the population
# order; not public).


def _member_linear_body(spec: _LinearSpec, x, weight, bias, seed, sign, sigma):
  """Unbatched meaning: the member of ``seed``'s pair whose sign is ``sign``.

  Computes both members (the op needs a pair) and selects one; only reached
  when a member is evaluated outside a vmap over its population.
  """
  pair = _population_linear_body(spec, x, weight, bias, jnp.stack([seed, seed]), sigma)
  return jnp.where(sign >= 0, pair[0], pair[1])


def _member_linear_rule(spec: _LinearSpec, axis_size, in_batched, x, weight, bias, seed, sign,
                        sigma):
  x_b, weight_b, bias_b, seed_b, sign_b, sigma_b = map(_is_batched, in_batched)
  if seed_b and sign_b and not (weight_b or bias_b or sigma_b):
    # population_apply's vmap: the axis *is* the antithetic population,
    # pairs consecutive with signs +1, -1.
    fn = _population_linear(dataclasses.replace(spec, shared_x=not x_b))
    return fn(x, weight, bias, seed, sigma), True
  if x_b and not (seed_b or sign_b or weight_b or bias_b or sigma_b):
    # x's new axis is one more leading dimension of the member's input.
    return _member_linear(spec)(x, weight, bias, seed, sign, sigma), True
  if not any((x_b, weight_b, bias_b, seed_b, sign_b, sigma_b)):
    return _member_linear(spec)(x, weight, bias, seed, sign, sigma), False
  return _fallback_vmap(functools.partial(_member_linear_body, spec), in_batched,
                        (x, weight, bias, seed, sign, sigma))


@functools.lru_cache(maxsize=None)
def _member_linear(spec: _LinearSpec):
  return _batched_and_differentiable(spec, _member_linear_body, _member_linear_rule)


def antithetic_member_linear(x, weight, bias, seed, sign, sigma, offset=0, *,
                             kind=noise_lib.DEFAULT_KIND, implementation="auto", config=None,
                             out_dtype=jnp.float32, rank=None):
  """Internal: one member of an antithetic population, sign given as an array.

  Only valid under a ``jax.vmap`` whose axis is a whole antithetic population
  in the op's order (``seed`` pairs equal and consecutive, ``sign`` = +1, -1,
  ...), as :func:`jaxnoise.nn.population.population_apply` builds it: the
  vmap rule then calls the op with ``antithetic=True`` without looking at the
  signs' values.
  """
  x, weight, bias = _check_linear_args(x, weight, bias)
  spec = _linear_spec(offset, kind, True, True, implementation, config, out_dtype, rank)
  return _member_linear(spec)(x, weight, bias, as_seed(seed),
                              jnp.asarray(sign, jnp.float32), _common.check_sigma(sigma))


# ----------------------------------------------------------------------------
# Reduce-metric per individual.


@dataclasses.dataclass(frozen=True)
class _MetricSpec:
  offset: int
  kind: noise_lib.NoiseKind
  implementation: str
  config: Any


def _population_metric_body(spec: _MetricSpec, center, seeds, sigma):
  return ops.virtual_reduce_metric(center, seeds, sigma, None, spec.offset, kind=spec.kind,
                                   implementation=spec.implementation, config=spec.config)


def _population_metric_rule(spec: _MetricSpec, axis_size, in_batched, center, seeds, sigma):
  center_b, seeds_b, sigma_b = map(_is_batched, in_batched)
  if seeds_b and not (center_b or sigma_b):
    pop = seeds.shape[1]
    metric = _population_metric(spec)(center, seeds.reshape(axis_size * pop), sigma)
    return metric.reshape(axis_size, pop), True
  if not (center_b or seeds_b or sigma_b):
    return _population_metric(spec)(center, seeds, sigma), False
  return _fallback_vmap(functools.partial(_population_metric_body, spec), in_batched,
                        (center, seeds, sigma))


@functools.lru_cache(maxsize=None)
def _population_metric(spec: _MetricSpec):
  return _batched_and_differentiable(spec, _population_metric_body, _population_metric_rule)


def reduce_metric(
    center: jax.Array,
    seed: Any,
    sigma: float | jax.Array,
    offset: int = 0,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    implementation: str = "auto",
    config: Any = None,
) -> jax.Array:
  """One individual's ``mean_k |center[k] + sigma noise(seed, offset + k)|``.

  ``jax.vmap`` over seeds is one :func:`jaxnoise.virtual_reduce_metric` call
  (``O(pop)`` memory in the kernel). Differentiable with respect to
  ``center`` with the reference implementation (the kernel has no VJP).

  Args:
    center: ``(n,)`` float vector.
    seed: the individual's integer seed (scalar).
    sigma: positive perturbation standard deviation.
    offset: element index of ``center[0]``.
    kind: noise kind.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or ``"reference"``.
    config: hashable kernel config or None.

  Returns:
    float32 scalar.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> seeds = jnp.arange(4, dtype=jnp.uint32)
    >>> jax.vmap(lambda s: reduce_metric(jnp.zeros(100), s, 1.0))(seeds).shape
    (4,)
  """
  center = _common.check_float_array(center, "center", (1,))
  spec = _MetricSpec(offset=noise_lib.check_offset(offset), kind=noise_lib.get_kind(kind),
                     implementation=_common.resolve_implementation(implementation),
                     config=config)
  return _population_metric(spec)(center, as_seed(seed)[None], _common.check_sigma(sigma))[0]


# ----------------------------------------------------------------------------
# Plain per-individual noise (elementwise hash: vmap of it is already one
# fused computation, so no custom rule is needed).


def individual_noise(
    seed: Any,
    shape: Any,
    offset: int = 0,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    rank: int | None = None,
) -> jax.Array:
  """One individual's noise block: row ``i`` of :func:`jaxnoise.virtual_noise`.

  Args:
    seed: the individual's integer seed (scalar).
    shape: block shape (flattened row-major from ``offset``).
    offset: element index of the block's first element.
    kind: noise kind.
    rank: None, or the rank of a 2-D block's low-rank noise.

  Returns:
    float32 array of ``shape``.

  Example:
    >>> import jax.numpy as jnp
    >>> individual_noise(3, (2, 5), offset=7).shape
    (2, 5)
  """
  return noise_lib.virtual_noise(as_seed(seed)[None], shape, offset, kind=kind, rank=rank)[0]


def perturb(
    value: jax.Array,
    seed: Any,
    sigma: float | jax.Array,
    offset: int = 0,
    *,
    sign: float | jax.Array = 1.0,
    kind: str = noise_lib.DEFAULT_KIND,
) -> jax.Array:
  """``value + sigma * sign * noise(seed)`` for one parameter block (plain JAX).

  The arithmetic matches the ops (``float32(value) + (sigma * sign) * noise``,
  then cast back to ``value``'s dtype), so a block perturbed here equals the
  same block inside :func:`jaxnoise.virtual_perturbed_linear`. Here ``sign``
  may be any array (e.g. ``+1`` / ``-1`` for antithetic members).

  Args:
    value: float array (any shape), flattened row-major from ``offset``.
    seed: integer seed (scalar).
    sigma: perturbation standard deviation.
    offset: element index of ``value``'s first element.
    sign: multiplier of the noise (scalar).
    kind: noise kind.

  Returns:
    Array like ``value``.

  Example:
    >>> import jax.numpy as jnp
    >>> bool(jnp.allclose(perturb(jnp.zeros(3), 5, 0.5), 0.5 * individual_noise(5, 3)))
    True
  """
  value = _common.check_float_array(value, "value", tuple(range(0, 8)))
  noise = individual_noise(seed, value.shape, offset, kind=kind)
  scale = jnp.asarray(sigma, jnp.float32) * jnp.asarray(sign, jnp.float32)
  return (value.astype(jnp.float32) + scale * noise).astype(value.dtype)
