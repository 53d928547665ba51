"""Pure-JAX reference implementations of the virtual-noise ops.

These are the CPU path and the test oracle of the Pallas kernels. They build
the noise of a *chunk* of the population at a time (never ``(pop, out, in)``
at once), so a CPU user with a large population does not run out of memory;
``chunk_size`` fixes the number of individuals per chunk (results do not
depend on it: the noise is a function of ``(seed, index)`` alone).

Inputs are assumed validated by :mod:`jaxnoise.ops.virtual_noise.api`:
``seeds`` is ``(pop,)`` uint32, ``sigma`` a float32 scalar, ``offset`` a
Python int, ``rank`` None (full rank) or a positive int.

With a ``rank`` the weight noise is the low-rank ``A_i B_i^T / sqrt(r)`` of
:mod:`jaxnoise.noise` ("Low-rank layout"): the ops form ``x_i B_i`` and
``(x_i B_i) A_i^T`` (or ``sum_i f_i A_i B_i^T``, a GEMM over ``pop * r``)
from factors built a chunk of the population at a time, never ``E_i``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _common

# Elements of noise one chunk may hold (float32: 64 MiB).
DEFAULT_CHUNK_ELEMENTS = 1 << 24
_HIGHEST = jax.lax.Precision.HIGHEST


def chunk_size_for(pop: int, elements_per_individual: int, chunk_size: int | None = None) -> int:
  """Individuals per chunk: ``chunk_size`` if given, else what fits the budget."""
  if chunk_size is not None:
    if chunk_size <= 0:
      raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    return min(int(chunk_size), pop)
  return max(1, min(pop, DEFAULT_CHUNK_ELEMENTS // max(1, elements_per_individual)))


def _map_chunks(fn: Callable, chunk: int, *xs):
  """``jnp.stack([fn(*x_i) for i])`` over the leading axis, ``chunk`` at a time."""
  return jax.lax.map(lambda args: fn(*args), xs, batch_size=chunk)


def _sum_chunks(fn: Callable, chunk: int, pop: int, init: jax.Array, *xs):
  """``sum_i fn(*x_i)`` over the leading axis, ``chunk`` individuals at a time.

  ``fn`` maps a chunk (leading axis ``chunk``) to a partial sum. The
  population is padded with zeros to a whole number of chunks; ``fn`` must
  return zero for padded rows (callers pad fitness with zeros).
  """
  n_chunks = -(-pop // chunk)
  pad = n_chunks * chunk - pop
  padded = [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)) for x in xs]
  chunked = [x.reshape((n_chunks, chunk) + x.shape[1:]) for x in padded]

  def body(acc, args):
    return acc + fn(*args), None

  init = _common.match_varying(init, *xs)[0]  # the carry varies like the inputs (shard_map)
  total, _ = jax.lax.scan(body, init, chunked)
  return total


def _weight_noise(seeds, offset, weight_shape, kind):
  """``(c, out, in)`` noise for a chunk of seeds ``(c,)``."""
  out_features, in_features = weight_shape
  hi, lo = noise_lib.block_index(offset, weight_shape)
  high = not noise_lib.fits_32_bits(kind, offset, out_features * in_features)
  return noise_lib.noise_at(seeds[:, None, None], hi[None], lo[None], kind, high_word=high)


def _low_rank_factors(seeds, offset, weight_shape, rank, kind):
  """``(c, out, r)`` and ``(c, in, r)`` factors (unsigned) for a chunk of seeds ``(c,)``."""
  values = jnp.swapaxes(noise_lib.factor_block_noise(seeds, offset, weight_shape, rank, kind),
                        1, 2)
  return values[:, :weight_shape[0]], values[:, weight_shape[0]:]


def low_rank_bias_offset(offset: int, weight_shape, rank: int | None) -> int:
  """Index of a linear layer's bias noise: right after its weight block."""
  return offset + noise_lib.noise_block_size(weight_shape, rank)


def _vector_noise(seeds, offset, length, kind):
  """``(c, length)`` noise for a chunk of seeds ``(c,)``."""
  hi, lo = noise_lib.block_index(offset, (length,))
  high = not noise_lib.fits_32_bits(kind, offset, length)
  return noise_lib.noise_at(seeds[:, None], hi[None], lo[None], kind, high_word=high)


def perturbed_linear_reference(
    x: jax.Array,
    weight: jax.Array,
    bias: jax.Array | None,
    seeds: jax.Array,
    sigma: jax.Array,
    offset: int,
    *,
    kind: noise_lib.NoiseKind,
    antithetic: bool,
    out_dtype=jnp.float32,
    chunk_size: int | None = None,
    rank: int | None = None,
    precision=_HIGHEST,
) -> jax.Array:
  """``Y[i] = X[i] @ (W + sigma s_i N_i)^T + (b + sigma s_i nb_i)`` in float32.

  With ``rank``, ``N_i = A_i B_i^T / sqrt(r)`` and the noise part is
  ``(X[i] B_i) A_i^T / sqrt(r)``, with products at ``precision`` (the GPU's
  materialised path passes its own).
  """
  if rank is not None:
    return _low_rank_linear(x, weight, bias, seeds, sigma, offset, kind=kind,
                            antithetic=antithetic, out_dtype=out_dtype, chunk_size=chunk_size,
                            rank=rank, precision=precision)
  pop = seeds.shape[0]
  out_features, in_features = weight.shape
  chunk = chunk_size_for(pop, out_features * in_features, chunk_size)
  pair_seeds = noise_lib.pair_seeds(seeds, antithetic)
  signs = noise_lib.antithetic_signs(pop, antithetic)
  weight32 = weight.astype(jnp.float32)
  bias32 = None if bias is None else bias.astype(jnp.float32)
  bias_offset = offset + out_features * in_features
  sigma = jnp.asarray(sigma, jnp.float32)

  def per_individual(x_i, seed, sign):
    scaled = sigma * sign
    perturbed = weight32 + scaled * _weight_noise(seed[None], offset, weight.shape, kind)[0]
    y = jnp.einsum("bk,ok->bo", x_i.astype(jnp.float32), perturbed, precision=_HIGHEST)
    if bias32 is not None:
      y = y + (bias32 + scaled * _vector_noise(seed[None], bias_offset, out_features, kind)[0])
    return y.astype(out_dtype)

  if x.ndim == 2:
    return _map_chunks(lambda s, g: per_individual(x, s, g), chunk, pair_seeds, signs)
  return _map_chunks(per_individual, chunk, x, pair_seeds, signs)


def _low_rank_linear(x, weight, bias, seeds, sigma, offset, *, kind, antithetic, out_dtype,
                     chunk_size, rank, precision):
  pop = seeds.shape[0]
  out_features, in_features = weight.shape
  batch = x.shape[-2]
  chunk = chunk_size_for(pop, (out_features + in_features) * rank + batch * out_features,
                         chunk_size)
  pair_seeds = noise_lib.pair_seeds(seeds, antithetic)
  signs = noise_lib.antithetic_signs(pop, antithetic)
  sigma = jnp.asarray(sigma, jnp.float32)
  factor = sigma * jnp.float32(1.0 / math.sqrt(rank))
  base = jnp.einsum("...bk,ok->...bo", x.astype(jnp.float32), weight.astype(jnp.float32),
                    precision=precision)
  if bias is not None:
    base = base + bias.astype(jnp.float32)
  bias_offset = low_rank_bias_offset(offset, weight.shape, rank)

  def per_individual(x_i, base_i, seed, sign):
    a, b = _low_rank_factors(seed[None], offset, weight.shape, rank, kind)
    projected = jnp.einsum("bk,kr->br", x_i.astype(jnp.float32), b[0], precision=precision)
    noise = jnp.einsum("br,or->bo", projected, a[0], precision=precision) * factor
    if bias is not None:
      noise = noise + sigma * _vector_noise(seed[None], bias_offset, out_features, kind)[0]
    return (base_i + sign * noise).astype(out_dtype)

  if x.ndim == 2:
    return _map_chunks(lambda s, g: per_individual(x, base, s, g), chunk, pair_seeds, signs)
  return _map_chunks(per_individual, chunk, x, base, pair_seeds, signs)


def perturbed_linear_input_grad_reference(
    grad_out: jax.Array,
    weight: jax.Array,
    seeds: jax.Array,
    sigma: jax.Array,
    offset: int,
    *,
    kind: noise_lib.NoiseKind,
    antithetic: bool,
    shared_x: bool,
    chunk_size: int | None = None,
    rank: int | None = None,
    precision=_HIGHEST,
) -> jax.Array:
  """``dX[i] = G[i] @ (W + sigma s_i N_i)``; summed over ``i`` when x is shared."""
  if rank is not None:
    return _low_rank_input_grad(grad_out, weight, seeds, sigma, offset, kind=kind,
                                antithetic=antithetic, shared_x=shared_x,
                                chunk_size=chunk_size, rank=rank, precision=precision)
  pop = seeds.shape[0]
  out_features, in_features = weight.shape
  chunk = chunk_size_for(pop, out_features * in_features, chunk_size)
  pair_seeds = noise_lib.pair_seeds(seeds, antithetic)
  signs = noise_lib.antithetic_signs(pop, antithetic)
  sigma = jnp.asarray(sigma, jnp.float32)
  grad_out = grad_out.astype(jnp.float32)
  weight32 = weight.astype(jnp.float32)

  def noise_part(g_c, seed_c, sign_c):
    scaled = (sigma * sign_c)[:, None, None]
    noise = scaled * _weight_noise(seed_c, offset, weight.shape, kind)
    return jnp.einsum("cbo,cok->cbk", g_c, noise, precision=_HIGHEST)

  base = jnp.einsum("...bo,ok->...bk", grad_out, weight32, precision=_HIGHEST)
  if shared_x:
    init = jnp.zeros((grad_out.shape[1], in_features), jnp.float32)
    noise_sum = _sum_chunks(
        lambda g, s, sg: noise_part(g, s, sg).sum(0), chunk, pop, init, grad_out, pair_seeds, signs
    )
    return base.sum(0) + noise_sum
  per_individual = _map_chunks(
      lambda g, s, sg: noise_part(g[None], s[None], sg[None])[0], chunk, grad_out, pair_seeds, signs
  )
  return base + per_individual


def _low_rank_input_grad(grad_out, weight, seeds, sigma, offset, *, kind, antithetic, shared_x,
                         chunk_size, rank, precision):
  """``dX[i] = G[i] W + sigma s_i (G[i] A_i) B_i^T / sqrt(r)`` (summed for shared x)."""
  pop, batch, out_features = grad_out.shape
  in_features = weight.shape[1]
  chunk = chunk_size_for(pop, (out_features + in_features) * rank + batch * in_features,
                         chunk_size)
  pair_seeds = noise_lib.pair_seeds(seeds, antithetic)
  signs = noise_lib.antithetic_signs(pop, antithetic)
  factor = jnp.asarray(sigma, jnp.float32) * jnp.float32(1.0 / math.sqrt(rank))
  grad_out = grad_out.astype(jnp.float32)

  def noise_part(g_c, seed_c, sign_c):
    a, b = _low_rank_factors(seed_c, offset, weight.shape, rank, kind)
    projected = jnp.einsum("cbo,cor->cbr", g_c, a, precision=precision)
    projected = projected * (factor * sign_c)[:, None, None]
    return jnp.einsum("cbr,ckr->cbk", projected, b, precision=precision)

  base = jnp.einsum("...bo,ok->...bk", grad_out, weight.astype(jnp.float32), precision=precision)
  if shared_x:
    init = jnp.zeros((batch, in_features), jnp.float32)
    noise_sum = _sum_chunks(lambda g, s, sg: noise_part(g, s, sg).sum(0), chunk, pop, init,
                            grad_out, pair_seeds, signs)
    return base.sum(0) + noise_sum
  per_individual = _map_chunks(
      lambda g, s, sg: noise_part(g[None], s[None], sg[None])[0], chunk, grad_out, pair_seeds,
      signs)
  return base + per_individual


def _paired_fitness(fitness, seeds, antithetic):
  """Fold antithetic pairs: ``(f_2m - f_2m+1, seeds[2m])``; else ``(f, seeds)``."""
  fitness = fitness.astype(jnp.float32)
  if antithetic:
    return fitness[0::2] - fitness[1::2], seeds[0::2]
  return fitness, seeds


def _block_noise(seeds, offset, shape, kind):
  """``(c, *shape)`` noise of a 1-D or 2-D block for a chunk of seeds ``(c,)``."""
  if len(shape) == 2:
    return _weight_noise(seeds, offset, shape, kind)
  return _vector_noise(seeds, offset, shape[0], kind)


def noise_gradient_reference(
    fitness: jax.Array,
    seeds: jax.Array,
    shape: tuple[int, ...],
    sigma: jax.Array,
    pop_size: int,
    offset: int,
    *,
    kind: noise_lib.NoiseKind,
    antithetic: bool,
    chunk_size: int | None = None,
    rank: int | None = None,
    precision=_HIGHEST,
) -> jax.Array:
  """``sum_i fitness_i s_i N_i / (pop_size * sigma)`` for a 2-D weight or 1-D bias block.

  With ``rank`` (2-D blocks), ``N_i = A_i B_i^T / sqrt(r)``: one GEMM
  ``(f * A)^T B`` over ``pop * r`` per chunk of the population, at
  ``precision`` (the reference's is HIGHEST; the GPU path passes its own).
  """
  if rank is not None:
    return low_rank_gradient(fitness, seeds, shape, sigma, pop_size, offset, kind=kind,
                              antithetic=antithetic, chunk_size=chunk_size, rank=rank,
                              precision=precision)
  weights, pair_seeds = _paired_fitness(fitness, seeds, antithetic)
  n = pair_seeds.shape[0]
  chunk = chunk_size_for(n, math.prod(shape), chunk_size)

  def partial(f_c, seed_c):
    return jnp.tensordot(f_c, _block_noise(seed_c, offset, shape, kind), axes=1,
                         precision=_HIGHEST)

  total = _sum_chunks(partial, chunk, n, jnp.zeros(shape, jnp.float32), weights, pair_seeds)
  return total / (jnp.float32(pop_size) * jnp.asarray(sigma, jnp.float32))


def low_rank_gradient(fitness, seeds, shape, sigma, pop_size, offset, *, kind, antithetic,
                      chunk_size, rank, precision, operand_dtype=jnp.float32, rows=None):
  """``sum_i f_i s_i A_i B_i^T / (pop_size sigma sqrt(r))``: a GEMM over ``chunk * r`` per chunk.

  The factors stay in their ``(c, r, out + in)`` index order, so each chunk is
  one GEMM ``(c r, out)^T (c r, in)`` with no transpose; the scale is folded
  into the fitness weights, and a single chunk skips the accumulation loop, so
  the ``(out, in)`` result is written once. ``rows=(row0, n)`` forms only rows
  ``[row0, row0 + n)`` (a device's shard, :mod:`jaxnoise.parallel`): ``A``'s
  rows are sliced, ``B`` is whole.
  """
  weights, pair_seeds = _paired_fitness(fitness, seeds, antithetic)
  n = pair_seeds.shape[0]
  out_features, in_features = shape
  width = out_features + in_features
  row0, n_rows = (0, out_features) if rows is None else rows
  chunk = chunk_size_for(n, width * rank, chunk_size)
  scale = jnp.float32(1.0 / math.sqrt(rank)) / (jnp.float32(pop_size)
                                                   * jnp.asarray(sigma, jnp.float32))
  weights = weights * scale

  def partial(f_c, seed_c):
    factors = noise_lib.factor_block_noise(seed_c, offset, shape, rank, kind)  # (c, r, out + in)
    a = (factors[..., row0:row0 + n_rows] * f_c[:, None, None]).astype(operand_dtype)
    b = factors[..., out_features:].astype(operand_dtype)
    return jax.lax.dot_general(
        a.reshape(-1, n_rows), b.reshape(-1, in_features), (((0,), (0,)), ((), ())),
        precision=precision, preferred_element_type=jnp.float32)

  if chunk >= n:
    return partial(weights, pair_seeds)
  return _sum_chunks(partial, chunk, n, jnp.zeros((n_rows, in_features), jnp.float32), weights,
                     pair_seeds)


# The seed document's two names for the same estimate.
weight_gradient_reference = noise_gradient_reference
bias_gradient_reference = noise_gradient_reference


def reduce_metric_reference(
    center: jax.Array,
    seeds: jax.Array,
    sigma: jax.Array,
    n_params: int,
    offset: int,
    *,
    kind: noise_lib.NoiseKind,
    antithetic: bool,
    chunk_size: int | None = None,
) -> jax.Array:
  """``mean_k |center[k] + sigma s_i noise[i, k]|`` per individual, ``(pop,)``."""
  pop = seeds.shape[0]
  center = center.astype(jnp.float32)
  pair_seeds = noise_lib.pair_seeds(seeds, antithetic)
  signs = noise_lib.antithetic_signs(pop, antithetic)
  sigma = jnp.asarray(sigma, jnp.float32)
  # Parameter windows, so one chunk never holds more than the budget.
  window = min(n_params, DEFAULT_CHUNK_ELEMENTS)
  chunk = chunk_size_for(pop, window, chunk_size)

  def per_individual(seed, sign):
    total = jnp.zeros((), jnp.float32)
    for start in range(0, n_params, window):
      length = min(window, n_params - start)
      noise = _vector_noise(seed[None], offset + start, length, kind)[0]
      total = total + jnp.abs(center[start:start + length] + (sigma * sign) * noise).sum()
    return total / jnp.float32(n_params)

  return _map_chunks(per_individual, chunk, pair_seeds, signs)
