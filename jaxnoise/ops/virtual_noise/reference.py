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
``(x_i B_i) A_i^T`` from factors built a chunk of the population at a time,
never ``E_i``.

The gradient estimates add, for every element, the population's terms one
after another in population order (:func:`noise_gradient_reference`,
:func:`low_rank_gradient`): no dot or reduce, whose summation order XLA
chooses from the shape. So an element's bits do not depend on the block's
size, and a device that forms some rows of a gradient
(:mod:`jaxnoise.parallel`) gets the rows one device gets, bit for bit.
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


def scaled_weights(fitness, seeds, antithetic, sigma, pop_size, scale, *, apart=False):
  """``(w, seeds)``: the folded fitness times ``scale / (pop_size * sigma)``.

  The gradient ops scale the weights first and sum weight times noise last,
  so a gradient ends with an addition: no product is left for XLA to fuse
  (as a fused multiply-add) into whatever uses the gradient in one program
  and not in another.

  ``apart=True`` forms ``w`` in a two-step loop, which XLA compiles apart
  from the program around it, so the fitness's producer (e.g. the shaping's
  last product) cannot fuse into the subtraction of a pair in one program
  and not in another. On a GPU an optimisation barrier before the gradient
  does that (XLA keeps it until after fusion); on the CPU, XLA removes
  barriers before fusing, so the CPU paths (reference and interpreter) use
  the loop.
  """
  if not apart:
    weights, pair_seeds = _paired_fitness(fitness, seeds, antithetic)
    factor = jnp.float32(scale) / (jnp.float32(pop_size) * jnp.asarray(sigma, jnp.float32))
    return weights * factor, pair_seeds
  pair = 2 if antithetic else 1
  n = seeds.shape[0] // pair
  half = -(-n // 2)
  padded = jnp.pad(fitness.astype(jnp.float32), (0, (2 * half - n) * pair))
  weights = jax.lax.map(
      lambda f: scaled_weights(f, f, antithetic, sigma, pop_size, scale)[0],
      padded.reshape(2, half * pair))
  return weights.reshape(-1)[:n], _paired_fitness(fitness, seeds, antithetic)[1]


def _block_q(seeds, offset, shape, kind):
  """``(c, *shape)`` unscaled noise ``q`` of a 1-D or 2-D block for seeds ``(c,)``."""
  hi, lo = noise_lib.block_index(offset, shape)
  high = not noise_lib.fits_32_bits(kind, offset, math.prod(shape))
  seeds = seeds.reshape((-1,) + (1,) * len(shape))
  return noise_lib.unscaled_noise(seeds, hi[None], lo[None], kind, high_word=high)


# Individuals whose terms one loop step adds, at most.
_MAX_STEP = 16


def _accumulate(terms, fitness, seeds, *, antithetic, sigma, pop_size, scale, shape,
                elements_per_individual):
  """``sum_i terms(w_i, seed_i)``, added in population order into a float32 ``shape``.

  ``w_i`` is the folded fitness times ``scale / (pop_size * sigma)`` (see
  :func:`scaled_weights`), formed inside the loop from the loop's slice of
  ``fitness``: the loop has at least two steps, so XLA compiles its body
  apart from the program around it and cannot fuse the fitness's producer
  (e.g. the shaping's last product) into the weights in one program and not
  in another. ``terms(w, seeds)`` maps a step of ``c`` individuals to ``c``
  lists of ``shape`` terms, added to the running sum one after another
  (``acc + term``: one elementwise chain, whose products XLA fuses into the
  additions the same way in any program). The order is individual by
  individual whatever the step, so the result depends neither on the step
  (derived from the block's size) nor on ``shape``: a row shard of a block
  (:mod:`jaxnoise.parallel`) equals those rows of the whole block, bit for bit.
  """
  pair = 2 if antithetic else 1
  n = seeds.shape[0] // pair
  step = max(1, min(_MAX_STEP, n, DEFAULT_CHUNK_ELEMENTS // 64 // max(1, elements_per_individual)))
  n_steps = max(2, -(-n // step))
  pad = n_steps * step - n  # zero fitness: acc + 0 * term == acc
  fitness = jnp.pad(fitness.astype(jnp.float32), (0, pad * pair)).reshape(n_steps, step * pair)
  seeds = jnp.pad(seeds, (0, pad * pair)).reshape(n_steps, step * pair)

  def body(acc, args):
    weights, step_seeds = scaled_weights(*args, antithetic, sigma, pop_size, scale)
    for individual_terms in terms(weights, step_seeds):
      for term in individual_terms:
        acc = acc + term
    return acc, None

  init = _common.match_varying(jnp.zeros(shape, jnp.float32), fitness, seeds)[0]
  total, _ = jax.lax.scan(body, init, (fitness, seeds))
  return total


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

  Each element is the sum, in population order, of ``w_i * q_i`` (``w_i`` the
  folded fitness times ``kind.scale / (pop_size * sigma)``, ``q_i`` the
  integer-valued noise), the order of the Pallas kernel within one
  population share. ``chunk_size`` is accepted for the old signature and
  changes nothing (the result does not depend on how many individuals are
  generated at once). With ``rank`` (2-D blocks), see
  :func:`low_rank_gradient`; ``precision`` is unused (products are float32).
  """
  del chunk_size, precision
  if rank is not None:
    return low_rank_gradient(fitness, seeds, shape, sigma, pop_size, offset, kind=kind,
                             antithetic=antithetic, rank=rank)
  dims = (1,) * len(shape)

  def terms(w, seeds_c):
    q = _block_q(seeds_c, offset, shape, kind)
    return [[w[j].reshape(dims) * q[j]] for j in range(w.shape[0])]

  return _accumulate(terms, fitness, seeds, antithetic=antithetic, sigma=sigma,
                     pop_size=pop_size, scale=kind.scale, shape=shape,
                     elements_per_individual=math.prod(shape))


def low_rank_gradient(fitness, seeds, shape, sigma, pop_size, offset, *, kind, antithetic, rank,
                      rows=None):
  """``sum_i f_i s_i A_i B_i^T / (pop_size sigma sqrt(r))``, as a sum of outer products in order.

  Each element adds ``(w_i q_A[j, c]) q_B[k, c]`` over individuals ``i`` and
  components ``c`` in turn (``w_i`` the folded fitness times ``kind.scale**2 /
  (sqrt(r) pop_size sigma)``, ``q`` the integer-valued factors): no GEMM,
  whose summation order would follow its shape. ``rows=(row0, n)`` forms only
  rows ``[row0, row0 + n)`` (a device's shard, :mod:`jaxnoise.parallel`),
  equal to those rows of the whole gradient bit for bit.
  """
  out_features, in_features = shape
  width = out_features + in_features
  row0, n_rows = (0, out_features) if rows is None else rows
  high = not noise_lib.fits_32_bits(kind, offset, rank * width)
  iota = lambda start, n: start + jax.lax.broadcasted_iota(jnp.uint32, (1, n), 1)
  a_hi, a_lo = noise_lib.block_index(offset, (rank, width), cols=iota(row0, n_rows))
  b_hi, b_lo = noise_lib.block_index(offset, (rank, width), cols=iota(out_features, in_features))

  def terms(w, seeds_c):
    seeds_c = seeds_c[:, None, None]
    q_a = noise_lib.unscaled_noise(seeds_c, a_hi[None], a_lo[None], kind, high_word=high)
    q_b = noise_lib.unscaled_noise(seeds_c, b_hi[None], b_lo[None], kind, high_word=high)
    return [[(w[j] * q_a[j, c])[:, None] * q_b[j, c][None, :] for c in range(rank)]
            for j in range(w.shape[0])]

  return _accumulate(terms, fitness, seeds, antithetic=antithetic, sigma=sigma,
                     pop_size=pop_size, scale=kind.scale * kind.scale / math.sqrt(rank),
                     shape=(n_rows, in_features), elements_per_individual=rank * n_rows * in_features)


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
