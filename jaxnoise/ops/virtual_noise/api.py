"""Public virtual-noise ops: validation, implementation switch, custom VJP.

Each op takes ``implementation=``:

* ``"auto"`` (default): the Pallas kernel on a GPU, the reference elsewhere;
* ``"pallas"``: the compiled Pallas (Triton backend) kernel, GPU only;
* ``"interpret"``: the same kernel through Pallas's interpreter (any
  backend; slow, for tests);
* ``"reference"``: pure JAX (:mod:`jaxnoise.ops.virtual_noise.reference`).

All four give the same noise bits; outputs agree to float tolerance.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _common
from jaxnoise.ops import autotune
from jaxnoise.ops.virtual_noise import config as config_lib
from jaxnoise.ops.virtual_noise import reference

__all__ = [
    "compute_offsets",
    "virtual_bias_gradient",
    "virtual_perturbed_linear",
    "virtual_reduce_metric",
    "virtual_weight_gradient",
    "virtual_weight_update",
]


def compute_offsets(param_shapes: Sequence[Sequence[int] | int], *,
                    rank: int | None = None) -> list[int]:
  """Cumulative flat-element offsets of consecutive parameter blocks.

  Block ``b`` starts at the total number of indices blocks ``0 .. b-1`` own:
  ``prod(shape)``, or ``rank * (out + in)`` for a 2-D block when ``rank`` is
  given (its low-rank factors; 1-D blocks such as biases stay full rank).
  Offsets are Python ints and may exceed 2**32.

  Args:
    param_shapes: shapes of the parameter blocks, in order (an int is a
      1-D shape). Dims are non-negative ints (floats raise ``TypeError``);
      the last block must end at or below 2**64 (``ValueError``).
    rank: None (full rank), or the rank of every 2-D block.

  Returns:
    One offset per block.

  Example:
    >>> compute_offsets([(256, 784), (256,), (10, 256), (10,)])
    [0, 200704, 200960, 203520]
    >>> compute_offsets([(256, 784), (256,), (10, 256), (10,)], rank=1)
    [0, 1040, 1296, 1562]
  """
  rank = noise_lib.check_rank(rank)
  offsets, total = [], 0
  for position, shape in enumerate(param_shapes):
    shape = noise_lib.check_dims(shape, f"param_shapes[{position}]")
    offsets.append(total)
    total += noise_lib.noise_block_size(shape, rank if len(shape) == 2 else None)
    noise_lib.check_block_end(0, total, f"param_shapes[:{position + 1}]")
  return offsets


def _kernels():
  """The Pallas module, imported lazily (it pulls in the Triton backend)."""
  from jaxnoise.ops.virtual_noise import pallas_triton  # pylint: disable=g-import-not-at-top
  return pallas_triton


def _low_rank_kernels():
  """The low-rank Pallas module, imported lazily."""
  from jaxnoise.ops.virtual_noise import pallas_triton_low_rank  # pylint: disable=g-import-not-at-top
  return pallas_triton_low_rank


def _check_population(seeds, antithetic: bool) -> jax.Array:
  seeds = noise_lib.as_seeds(seeds)
  if antithetic and seeds.shape[0] % 2:
    raise ValueError(
        f"antithetic=True needs an even population, got seeds with shape {seeds.shape}"
    )
  return seeds


@dataclasses.dataclass(frozen=True)
class _LinearStatic:
  """Static (hashable) arguments of the perturbed linear."""

  offset: int
  kind: noise_lib.NoiseKind
  antithetic: bool
  implementation: str
  config: Any
  out_dtype: Any
  shared_x: bool
  rank: int | None = None


def virtual_perturbed_linear(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    seeds: jax.Array,
    sigma: float | jax.Array,
    offset: int = 0,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    antithetic: bool = False,
    implementation: str = "auto",
    config: Any = None,
    out_dtype: Any = jnp.float32,
    rank: int | None = None,
) -> jax.Array:
  """A linear layer evaluated for a whole population of perturbed weights.

  ``Y[i] = X[i] @ (W + sigma s_i N_i)^T + (b + sigma s_i nb_i)`` where
  ``N_i`` and ``nb_i`` are the virtual noise of individual ``i`` (weight
  element ``(j, k)`` at index ``offset + j * in + k``, bias element ``j`` at
  ``offset + out * in + j``) and ``s_i`` is +1, or -1 for the second member
  of an antithetic pair. The kernels never store the noise.

  With ``rank=r``, ``N_i = A_i B_i^T / sqrt(r)`` is a low-rank perturbation
  (factors at the indices of :mod:`jaxnoise.noise`'s "Low-rank layout"; the
  bias noise follows the factors at ``offset + r * (out + in) + j``), and
  ``Y[i] = X[i] W^T + sigma s_i (X[i] B_i) A_i^T / sqrt(r) + ...`` costs
  ``(out + in) * r`` noise values per individual instead of ``out * in``.

  Differentiable with respect to ``x``, ``weight``, ``bias`` and ``sigma``
  (the backward pass regenerates the noise).

  Args:
    x: ``(batch, in)`` input shared by all individuals, or
      ``(pop, batch, in)`` per individual; float32, bfloat16 or float16.
    weight: ``(out, in)`` float32, bfloat16 or float16.
    bias: ``(out,)`` or None.
    seeds: ``(pop,)`` seeds (uint32; signed ints wrap modulo 2**32).
    sigma: positive perturbation standard deviation (scalar; may be traced).
    offset: element index of ``weight[0, 0]`` (Python int).
    kind: noise kind, see :mod:`jaxnoise.noise`.
    antithetic: individuals ``2m`` and ``2m + 1`` share ``seeds[2m]`` with
      signs +1 and -1 (``seeds[2m + 1]`` is ignored).
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"`` or
      ``"reference"``.
    config: kernel config (:class:`PerturbedLinearConfig`); None picks the
      autotuned or heuristic one. Ignored by the reference.
    out_dtype: output dtype (accumulation is float32).
    rank: None (full-rank noise) or a positive int (low-rank noise).

  Returns:
    ``(pop, batch, out)`` array of ``out_dtype``.

  Example:
    >>> import jax, jax.numpy as jnp
    >>> x, w = jnp.ones((3, 8)), jnp.zeros((4, 8))
    >>> seeds = jnp.arange(5, dtype=jnp.uint32)
    >>> virtual_perturbed_linear(x, w, None, seeds, 0.1).shape
    (5, 3, 4)
    >>> virtual_perturbed_linear(x, w, None, seeds, 0.1, rank=1).shape
    (5, 3, 4)
  """
  weight = _common.check_float_array(weight, "weight", (2,))
  x = _common.check_float_array(x, "x", (2, 3))
  seeds = _check_population(seeds, antithetic)
  pop = seeds.shape[0]
  out_features, in_features = weight.shape
  if x.shape[-1] != in_features:
    raise ValueError(
        f"x's last dimension must equal weight's in_features={in_features}; "
        f"x {_common.describe(x)}, weight {_common.describe(weight)}"
    )
  if x.ndim == 3 and x.shape[0] != pop:
    raise ValueError(
        f"per-individual x must have one row block per seed: x {_common.describe(x)}, "
        f"seeds {_common.describe(seeds)}"
    )
  if bias is not None:
    bias = _common.check_float_array(bias, "bias", (1,))
    if bias.shape != (out_features,):
      raise ValueError(
          f"bias must have shape ({out_features},) to match weight {weight.shape}, "
          f"got {_common.describe(bias)}"
      )
  sigma = _common.check_sigma(sigma)
  static = _LinearStatic(
      offset=noise_lib.check_offset(offset),
      kind=noise_lib.get_kind(kind),
      antithetic=bool(antithetic),
      implementation=_common.resolve_implementation(implementation),
      config=config,
      out_dtype=_common.check_out_dtype(out_dtype),
      shared_x=x.ndim == 2,
      rank=noise_lib.check_rank(rank),
  )
  noise_lib.check_block_end(static.offset,
                            noise_lib.noise_block_size((out_features, in_features), static.rank)
                            + (out_features if bias is not None else 0), "weight and bias")
  batch = x.shape[-2]
  if batch == 0 or out_features == 0:
    # An empty result (the reference's); the kernels' grids need at least one tile.
    return jnp.zeros((pop, batch, out_features), static.out_dtype)
  if in_features == 0 and static.implementation != "reference":
    # No weight noise: the bias term alone, which the reference computes exactly.
    static = dataclasses.replace(static, implementation="reference")
  args = _common.match_varying(x, weight, bias, seeds, sigma)
  try:
    return _perturbed_linear(static, *args)
  except NotImplementedError as error:
    if "symbolic_zeros" not in str(error):
      raise
    # Eager jax.shard_map (no jit around it) cannot bind a custom_vjp with
    # symbolic zeros; a jit can, and shard_map runs the jit per shard.
    return _perturbed_linear_jit(static, *args)


def _forward(static: _LinearStatic, x, weight, bias, seeds, sigma):
  if static.implementation == "reference":
    return reference.perturbed_linear_reference(
        x, weight, bias, seeds, sigma, static.offset, kind=static.kind,
        antithetic=static.antithetic, out_dtype=static.out_dtype, rank=static.rank,
    )
  if static.rank is not None:
    return _low_rank_kernels().low_rank_perturbed_linear(
        x, weight, bias, seeds, sigma, static.offset, kind=static.kind,
        antithetic=static.antithetic, out_dtype=static.out_dtype, rank=static.rank,
        config=static.config, interpret=static.implementation == "interpret")
  config = static.config
  if config is None:
    config = autotune.lookup(*_linear_tuning_key(static, x, weight, bias, seeds))
  return _kernels().perturbed_linear(
      x, weight, bias, seeds, sigma, static.offset, kind=static.kind,
      antithetic=static.antithetic, out_dtype=static.out_dtype, config=config,
      interpret=static.implementation == "interpret",
  )


def _linear_tuning_key(static: _LinearStatic, x, weight, bias, seeds):
  key = config_lib.perturbed_linear_key(
      static.implementation, x.shape, x.dtype, weight.shape, weight.dtype, bias is not None,
      seeds.shape[0], static.kind, static.antithetic, static.offset, static.out_dtype)
  return key[0], key


def _input_grad(static: _LinearStatic, grad_out, weight, seeds, sigma):
  if static.implementation == "reference":
    return reference.perturbed_linear_input_grad_reference(
        grad_out, weight, seeds, sigma, static.offset, kind=static.kind,
        antithetic=static.antithetic, shared_x=static.shared_x, rank=static.rank,
    )
  if static.rank is not None:
    return _low_rank_kernels().low_rank_input_grad(
        grad_out, weight, seeds, sigma, static.offset, kind=static.kind,
        antithetic=static.antithetic, shared_x=static.shared_x, rank=static.rank,
        config=static.config, interpret=static.implementation == "interpret")
  config = None
  if not _uses_tf32(static):
    _, batch, out_features = grad_out.shape
    config = dataclasses.replace(
        config_lib.input_grad_heuristics(batch, out_features, weight.shape[1], static.kind),
        tf32=False)
  return _kernels().perturbed_linear_input_grad(
      grad_out, weight, seeds, sigma, static.offset, kind=static.kind,
      antithetic=static.antithetic, shared_x=static.shared_x, config=config,
      interpret=static.implementation == "interpret",
  )


def _uses_tf32(static: _LinearStatic) -> bool:
  """Whether float32 products may use TF32: the backward follows the forward's config.

  The reference is exact (HIGHEST); the kernels use TF32 unless the config
  passed to the forward says ``tf32=False``.
  """
  if static.implementation == "reference":
    return False
  return static.config is None or static.config.tf32


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _perturbed_linear(static, x, weight, bias, seeds, sigma):
  return _forward(static, x, weight, bias, seeds, sigma)


def _perturbed_linear_fwd(static, x, weight, bias, seeds, sigma):
  values = jax.tree.map(lambda p: p.value, (x, weight, bias, seeds, sigma))
  perturbed = jax.tree.map(lambda p: p.perturbed, (x, weight, bias, seeds, sigma))
  out = _forward(static, *values)
  return out, (values, perturbed)


def _perturbed_linear_bwd(static, residuals, grad_out):
  (x, weight, bias, seeds, sigma), (x_p, weight_p, bias_p, _, sigma_p) = residuals
  if isinstance(grad_out, jax.custom_derivatives.SymbolicZero):
    grad_out = jnp.zeros(grad_out.shape, grad_out.dtype)
  grad_out = grad_out.astype(jnp.float32)
  grad_x = grad_weight = grad_bias = grad_sigma = None
  if x_p:
    grad_x = _input_grad(static, grad_out, weight, seeds, sigma).astype(x.dtype)
  if weight_p:
    x32 = x.astype(jnp.float32)
    precision = None if _uses_tf32(static) else jax.lax.Precision.HIGHEST
    if static.shared_x:
      grad_weight = jnp.einsum("bo,bk->ok", grad_out.sum(0), x32, precision=precision)
    else:
      grad_weight = jnp.einsum("pbo,pbk->ok", grad_out, x32, precision=precision)
    grad_weight = grad_weight.astype(weight.dtype)
  if bias is not None and bias_p:
    grad_bias = grad_out.sum((0, 1)).astype(bias.dtype)
  if sigma_p:
    # dY/dsigma is the noise term alone: the op with W = 0, b = 0, sigma = 1.
    zero_bias = None if bias is None else jnp.zeros_like(bias)
    noise_term = _forward(static, x, jnp.zeros_like(weight), zero_bias, seeds, jnp.float32(1))
    grad_sigma = jnp.sum(grad_out * noise_term.astype(jnp.float32)).astype(sigma.dtype)
  return grad_x, grad_weight, grad_bias, None, grad_sigma


_perturbed_linear.defvjp(_perturbed_linear_fwd, _perturbed_linear_bwd, symbolic_zeros=True)
_perturbed_linear_jit = jax.jit(_perturbed_linear, static_argnums=0)


def _check_fitness(fitness, seeds):
  fitness = _common.check_float_array(fitness, "fitness", (1,))
  if fitness.shape[0] != seeds.shape[0]:
    raise ValueError(
        f"fitness and seeds must have the same length: fitness {_common.describe(fitness)}, "
        f"seeds {_common.describe(seeds)}"
    )
  # One NaN would make every gradient entry NaN: concrete fitness raises; traced
  # fitness is checked under jaxnoise.checks.checkify (the ES transform repairs it).
  _common.check_finite_values(fitness, "fitness")
  return fitness


def virtual_weight_gradient(
    fitness: jax.Array,
    seeds: jax.Array,
    weight_shape: Sequence[int],
    sigma: float | jax.Array,
    pop_size: int | None = None,
    offset: int = 0,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    antithetic: bool = False,
    implementation: str = "auto",
    config: Any = None,
    rank: int | None = None,
    out_dtype: Any = jnp.float32,
) -> jax.Array:
  """ES estimate of a weight gradient from fitness, regenerating the noise.

  ``grad[j, k] = sum_i fitness_i s_i N_i[j, k] / (pop_size * sigma)`` with
  the same noise as :func:`virtual_perturbed_linear` (index
  ``offset + j * in + k``). With ``antithetic=True`` each pair contributes
  ``(f_2m - f_2m+1) N_m`` and the noise is generated once per pair.

  With ``rank=r`` the noise is low rank, ``N_i = A_i B_i^T / sqrt(r)``
  (see :func:`virtual_perturbed_linear`), and the estimate is one GEMM
  ``sum_i f_i A_i B_i^T`` over ``pop * r`` from factors regenerated a chunk
  of the population at a time.

  Args:
    fitness: ``(pop,)`` float fitness (already shaped, see
      :mod:`jaxnoise.optim`).
    seeds: ``(pop,)`` seeds.
    weight_shape: ``(out, in)``.
    sigma: the perturbation standard deviation used in the forward pass.
    pop_size: the divisor's population size (default ``len(fitness)``).
    offset: element index of ``weight[0, 0]``.
    kind: noise kind.
    antithetic: antithetic pairs (see :func:`virtual_perturbed_linear`).
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel config (:class:`WeightGradientConfig`, or
      :class:`LowRankGradientConfig` with a ``rank``) or None.
    rank: None (full-rank noise) or a positive int (low-rank noise).
    out_dtype: the result's float dtype. The estimate is summed in float32
      and rounded once to it, so every dtype gets the float32 estimate's
      bits rounded. With ``rank`` and the tile kernel (not ``xla_gemm``),
      the last contraction's tiles round as they store: with one
      contraction the float32 estimate is never stored, with several only
      their running sum is (a bf16 layer's gradient writes half the bytes,
      and no pass converts it); elsewhere the float32 sum is rounded after.

  Returns:
    ``weight_shape`` gradient estimate of ``out_dtype``.

  Example:
    >>> import jax.numpy as jnp
    >>> g = virtual_weight_gradient(jnp.ones(4), jnp.arange(4), (2, 3), 0.1)
    >>> g.shape
    (2, 3)
    >>> virtual_weight_gradient(jnp.ones(4), jnp.arange(4), (2, 3), 0.1, rank=2).shape
    (2, 3)
    >>> low = virtual_weight_gradient(jnp.ones(4), jnp.arange(4), (2, 3), 0.1, rank=2,
    ...                               out_dtype=jnp.bfloat16)
    >>> low.dtype
    dtype(bfloat16)
  """
  seeds = _check_population(seeds, antithetic)
  fitness = _check_fitness(fitness, seeds)
  weight_shape = _common.check_shape(weight_shape, "weight_shape", 2, allow_zero=True)
  rank = noise_lib.check_rank(rank)
  out_dtype = _common.check_out_dtype(out_dtype)
  return _gradient(fitness, seeds, weight_shape, sigma, pop_size, offset, kind, antithetic,
                   implementation, config, rank, out_dtype=out_dtype)


def virtual_weight_update(
    weight: jax.Array,
    fitness: jax.Array,
    seeds: jax.Array,
    sigma: float | jax.Array,
    step_size: float | jax.Array,
    pop_size: int | None = None,
    offset: int = 0,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    antithetic: bool = False,
    implementation: str = "auto",
    config: Any = None,
    rank: int | None = None,
) -> jax.Array:
  """One plain SGD ascent step on the ES estimate: ``weight + step_size * gradient``.

  ``gradient`` is :func:`virtual_weight_gradient` of the same arguments; the
  sum is formed in float32 and rounded once to ``weight``'s dtype. With
  ``rank`` on a GPU and the tile kernel (not ``xla_gemm``), each output tile
  of the last contraction adds ``step_size`` times the sum to the weight tile
  in its epilogue: ``weight`` is read and written once, in place when the
  caller donates it (``jax.jit(..., donate_argnums=...)``), and where one
  contraction covers the population (the default
  ``LowRankGradientConfig.chunk`` takes up to ``2**24 / ((out + in) r)``
  members) the gradient is never stored; with more, only the earlier
  contractions' running float32 sum is. With ``xla_gemm`` the gradient is
  formed, then added.

  This is what ``optax.sgd(step_size)`` on the negated estimate followed by
  ``optax.apply_updates`` computes, with one rounding instead of three (the
  gradient's, the update's and the sum's in ``weight``'s dtype); it has no
  weight decay and no finiteness check (:mod:`jaxnoise.optim` has both). The
  estimate itself is finite for finite fitness: its noise is bounded.

  On an H200 (``benchmarks/RESULTS.md``, session 20; bf16 ``(8192, 8192)``,
  1024 members in pairs, rank 1, device time): 193 us with
  ``LowRankGradientConfig(operand_dtype="bfloat16", block_rows=128,
  block_cols=256, block_k=64, num_warps=8)`` against 306 us for the
  gradient, then the step; 466 against 584 us with the default (float32)
  tiles. With ``xla_gemm=True`` XLA stores the float32 gradient and adds it
  in a pass of its own (297 us).

  Args:
    weight: ``(out, in)`` float array.
    fitness: ``(pop,)`` float fitness (already shaped, see
      :mod:`jaxnoise.optim`).
    seeds: ``(pop,)`` seeds.
    sigma: the perturbation standard deviation used in the forward pass.
    step_size: float scalar (may be traced); negative descends.
    pop_size: the divisor's population size (default ``len(fitness)``).
    offset: element index of ``weight[0, 0]``.
    kind: noise kind.
    antithetic: antithetic pairs.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: as for :func:`virtual_weight_gradient`.
    rank: None (full-rank noise) or a positive int (low-rank noise).

  Returns:
    The updated weight, ``weight``'s shape and dtype.

  Example:
    >>> import jax.numpy as jnp
    >>> w = jnp.zeros((2, 3), jnp.bfloat16)
    >>> new = virtual_weight_update(w, jnp.ones(4), jnp.arange(4), 0.1, 0.5, rank=1)
    >>> new.shape, new.dtype
    ((2, 3), dtype(bfloat16))
    >>> g = virtual_weight_gradient(jnp.ones(4), jnp.arange(4), (2, 3), 0.1, rank=1)
    >>> bool(jnp.all(new == (0.5 * g).astype(jnp.bfloat16)))
    True
  """
  weight = _common.check_float_array(weight, "weight", (2,))
  step = _check_step_size(step_size)
  seeds = _check_population(seeds, antithetic)
  fitness = _check_fitness(fitness, seeds)
  rank = noise_lib.check_rank(rank)
  if weight.size == 0:
    return weight
  implementation = _common.resolve_implementation(implementation)
  if rank is not None and implementation != "reference":
    return _gradient(fitness, seeds, weight.shape, sigma, pop_size, offset, kind, antithetic,
                     implementation, config, rank, update=(weight, step))
  gradient = _gradient(fitness, seeds, weight.shape, sigma, pop_size, offset, kind, antithetic,
                       implementation, config, rank)
  return (weight.astype(jnp.float32) + step * gradient).astype(weight.dtype)


def _check_step_size(step_size) -> jax.Array:
  """A float scalar (finite when concrete), as a float32 array."""
  dtype = getattr(step_size, "dtype", None)
  if isinstance(step_size, bool) or (dtype is not None
                                     and not jnp.issubdtype(dtype, jnp.floating)):
    raise TypeError(f"step_size must be a float scalar, got {_common.describe(step_size)}")
  if np.ndim(step_size) != 0:
    raise ValueError(f"step_size must be a scalar, got {_common.describe(step_size)}")
  as_float = _common.concrete_float(step_size)
  if as_float is not None and not math.isfinite(as_float):
    raise ValueError(f"step_size must be finite, got {as_float}")
  return jnp.asarray(step_size, jnp.float32)


def virtual_bias_gradient(
    fitness: jax.Array,
    seeds: jax.Array,
    bias_shape: Sequence[int] | int,
    sigma: float | jax.Array,
    pop_size: int | None = None,
    offset: int = 0,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    antithetic: bool = False,
    implementation: str = "auto",
    config: Any = None,
) -> jax.Array:
  """ES estimate of a bias (any 1-D block) gradient.

  ``grad[j] = sum_i fitness_i s_i nb_i[j] / (pop_size * sigma)`` with
  ``nb_i[j]`` at index ``offset + j``: pass the bias's own offset
  (``weight_offset + out * in`` for a linear layer's bias).

  Args:
    fitness: ``(pop,)`` float fitness.
    seeds: ``(pop,)`` seeds.
    bias_shape: ``(out,)`` (or an int).
    sigma: perturbation standard deviation.
    pop_size: divisor's population size (default ``len(fitness)``).
    offset: element index of ``bias[0]``.
    kind: noise kind.
    antithetic: antithetic pairs.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel config or None.

  Returns:
    ``bias_shape`` float32 gradient estimate.

  Example:
    >>> import jax.numpy as jnp
    >>> virtual_bias_gradient(jnp.ones(4), jnp.arange(4), 3, 0.1, offset=6).shape
    (3,)
  """
  seeds = _check_population(seeds, antithetic)
  fitness = _check_fitness(fitness, seeds)
  bias_shape = _common.check_shape(bias_shape, "bias_shape", 1, allow_zero=True)
  return _gradient(fitness, seeds, bias_shape, sigma, pop_size, offset, kind, antithetic,
                   implementation, config)


def _gradient(fitness, seeds, shape, sigma, pop_size, offset, kind, antithetic, implementation,
              config, rank=None, rows=None, update=None, out_dtype=jnp.float32):
  """The gradient ops' dispatch; ``rows=(row0, n)`` (low rank): only those rows.

  ``update=(weight, step)`` (low-rank kernels only): ``weight + step * gradient``
  (:func:`pallas_triton_low_rank.low_rank_gradient`). Otherwise the float32
  estimate rounded once to ``out_dtype``: by the low-rank kernels in their
  epilogue, after the others.
  """
  sigma = _common.check_sigma(sigma)
  pop_size = fitness.shape[0] if pop_size is None else _common.check_positive_int(
      pop_size, "pop_size")
  offset = noise_lib.check_offset(offset)
  kind = noise_lib.get_kind(kind)
  implementation = _common.resolve_implementation(implementation)
  noise_lib.check_block_end(offset, math.prod(shape), "the gradient's shape")
  if math.prod(shape) == 0:
    return jnp.zeros(shape, out_dtype)
  if rows is not None and rank is None:
    raise ValueError("rows is for low-rank blocks; give a full-rank shard its own shape and offset")
  if rank is not None and implementation != "reference":
    return _low_rank_kernels().low_rank_gradient(
        fitness, seeds, shape, sigma, pop_size, offset, kind=kind, antithetic=antithetic,
        rank=rank, config=config, interpret=implementation == "interpret", rows=rows,
        update=update, out_dtype=out_dtype)
  if rank is not None:
    gradient = reference.low_rank_gradient(fitness, seeds, shape, sigma, pop_size, offset,
                                           kind=kind, antithetic=antithetic, rank=rank, rows=rows)
  elif implementation == "reference":
    gradient = reference.noise_gradient_reference(fitness, seeds, shape, sigma, pop_size, offset,
                                                  kind=kind, antithetic=antithetic)
  else:
    if config is None:
      key = config_lib.noise_gradient_key(implementation, seeds.shape[0], shape, kind,
                                          antithetic, offset)
      config = autotune.lookup(key[0], key)
    gradient = _kernels().noise_gradient(
        fitness, seeds, shape, sigma, pop_size, offset, kind=kind, antithetic=antithetic,
        config=config, interpret=implementation == "interpret",
    )
  return gradient.astype(out_dtype)


def virtual_reduce_metric(
    center: jax.Array,
    seeds: jax.Array,
    sigma: float | jax.Array,
    n_params: int | None = None,
    offset: int = 0,
    *,
    kind: str = noise_lib.DEFAULT_KIND,
    antithetic: bool = False,
    implementation: str = "auto",
    config: Any = None,
) -> jax.Array:
  """Per-individual mean absolute value of a perturbed vector.

  ``metric[i] = mean_k |center[k] + sigma s_i noise(seed_i, offset + k)|``,
  with ``O(pop)`` memory in the kernel.

  Args:
    center: ``(n_params,)`` float vector (e.g. flattened parameters).
    seeds: ``(pop,)`` seeds.
    sigma: perturbation standard deviation.
    n_params: must equal ``center.shape[0]`` if given (kept for the seed
      document's signature).
    offset: element index of ``center[0]``.
    kind: noise kind.
    antithetic: antithetic pairs.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel config or None.

  Returns:
    ``(pop,)`` float32.

  Example:
    >>> import jax.numpy as jnp
    >>> virtual_reduce_metric(jnp.zeros(100), jnp.arange(3), 1.0).shape
    (3,)
  """
  center = _common.check_float_array(center, "center", (1,))
  seeds = _check_population(seeds, antithetic)
  if center.shape[0] == 0:
    raise ValueError(f"center must not be empty (the metric is a mean over it), got "
                     f"{_common.describe(center)}")
  if n_params is not None and n_params != center.shape[0]:
    raise ValueError(f"n_params={n_params} must equal center's length, got {_common.describe(center)}")
  sigma = _common.check_sigma(sigma)
  offset = noise_lib.check_offset(offset)
  noise_lib.check_block_end(offset, center.shape[0], "center")
  kind = noise_lib.get_kind(kind)
  implementation = _common.resolve_implementation(implementation)
  if implementation == "reference":
    return reference.reduce_metric_reference(
        center, seeds, sigma, center.shape[0], offset, kind=kind, antithetic=antithetic)
  if config is None:
    key = config_lib.reduce_metric_key(implementation, seeds.shape[0], center.shape[0], kind,
                                       antithetic, offset)
    config = autotune.lookup(key[0], key)
  return _kernels().reduce_metric(
      center, seeds, sigma, offset, kind=kind, antithetic=antithetic, config=config,
      interpret=implementation == "interpret",
  )
