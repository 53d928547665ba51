"""Pallas kernels (GPU Triton backend) of the virtual-noise ops.

The noise is generated in registers from ``(seed, element index)`` with the
functions of :mod:`jaxnoise.noise` (the one hash), tile by tile, inside the
matrix product, the gradient estimate and the reduce-metric. It is never
written to memory. Kernels feed the integer-valued ``q`` of each kind to the
matrix units and apply the kind's scale (times ``sigma``) once to the
accumulated result.

Tiles are powers of two (the GPU lowering requires it) over ragged arrays:
loads and stores are masked. The same kernels run on CPU through Pallas's
interpreter (``interpret=True``), which is how CI tests them.

Index bookkeeping per tile: each row of a tile knows the (64-bit) word index
of its first element; elements add a 32-bit delta, and when some word index
reaches 2**32 a carry selects between the keys of the row's high word and
the next one (a row spans fewer than 2**32 words). The "rademacher" kind
hashes one word per 32 elements per row and each element selects its word
and bit; rows that do not start on a word boundary (``in`` or ``offset`` not
a multiple of 32) take each element's bit from one of two neighbouring
words. Where the noise only flips a sign (gradient, reduce-metric), the bit
is xor-ed into the float's sign bit instead of building +-1 and multiplying.

No kernel transposes a noise tile: the forward's ``x @ N^T`` builds ``N^T``
directly. XLA's Triton pipeline pushes a transpose up through every
elementwise op, copying each shared subexpression once per use, which over
the hash made compile times exponential in its depth (issue 14).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _common
from jaxnoise.ops import _pallas
from jaxnoise.ops.virtual_noise import config as config_lib
from jaxnoise.ops.virtual_noise import reference

_U32 = jnp.uint32
_F32 = jnp.float32


# ----------------------------------------------------------------------------
# Noise tiles (shared by every kernel).


@dataclasses.dataclass(frozen=True)
class NoiseLayout:
  """Where a ``(rows, n_cols)`` block's noise comes from (static).

  Attributes:
    kind: the noise kind.
    offset: index of element ``(0, 0)``.
    n_cols: row length in index space.
    element_fits: every element index is below 2**32.
    block_fits: the block itself has at most 2**32 elements (so ``row * n_cols``
      needs no 64-bit product).
    high_word: some word index is 2**32 or more.
    aligned: every row starts on a word boundary (always true for kinds with
      one value per word).
  """

  kind: noise_lib.NoiseKind
  offset: int
  n_cols: int
  element_fits: bool
  block_fits: bool
  high_word: bool
  aligned: bool

  @classmethod
  def of_block(cls, kind: noise_lib.NoiseKind, offset: int, n_rows: int, n_cols: int):
    end = offset + n_rows * n_cols
    per_word = kind.values_per_word
    return cls(
        kind=kind,
        offset=offset,
        n_cols=n_cols,
        element_fits=end <= 1 << 32,
        block_fits=n_rows * n_cols <= 1 << 32,
        high_word=not noise_lib.fits_32_bits(kind, offset, n_rows * n_cols),
        aligned=per_word == 1 or (offset % per_word == 0 and n_cols % per_word == 0),
    )


@dataclasses.dataclass(frozen=True)
class _RowStart:
  word_hi: jax.Array | None
  word_lo: jax.Array
  lane: jax.Array | None


def _row_start(layout: NoiseLayout, rows: jax.Array) -> _RowStart:
  """Word index (and lane) of each row's first element; ``rows`` is uint32 ``(R, 1)``."""
  if layout.element_fits:
    hi = jnp.zeros_like(rows)
    lo = rows * _U32(layout.n_cols) + _U32(layout.offset)
  else:
    if layout.block_fits:
      product_hi, product_lo = jnp.zeros_like(rows), rows * _U32(layout.n_cols)
    else:
      product_hi, product_lo = noise_lib.mul_wide(rows, layout.n_cols)
    offset_hi, offset_lo = noise_lib.split_u64(layout.offset)
    hi, lo = noise_lib.add_wide(product_hi, product_lo, _U32(offset_hi), _U32(offset_lo))
  word_hi, word_lo, lane = noise_lib.word_address(layout.kind, hi, lo)
  return _RowStart(word_hi if layout.high_word else None, word_lo, lane)


def _stream_keys(layout: NoiseLayout, seed: jax.Array, start: _RowStart):
  """Keys of the streams a tile needs: one pair, or per row for hi and hi + 1."""
  if not layout.high_word:
    return noise_lib.stream_keys(seed, _U32(0))
  return (noise_lib.stream_keys(seed, start.word_hi),
          noise_lib.stream_keys(seed, start.word_hi + _U32(1)))


def _words(layout: NoiseLayout, keys, start: _RowStart, delta: jax.Array) -> jax.Array:
  """Hash words at word index ``row start + delta``, broadcast to a tile.

  Rows ``(R, 1)`` and ``delta`` ``(1, C)`` give an ``(R, C)`` tile; rows
  ``(1, R)`` and ``delta`` ``(C, 1)`` give its transpose ``(C, R)``.

  Without a high word the stream is the same for the whole tile, and
  ``(lo_row + delta) * m + c == delta * m + (lo_row * m + c)`` (mod 2**32):
  the two products are taken on the tile's edges, leaving one add per element
  before the finaliser (same bits as :func:`jaxnoise.noise.hash_word`).
  """
  if not layout.high_word:
    multiplier, increment = keys
    row_part = start.word_lo * multiplier + increment
    return noise_lib.mix32(delta * multiplier + row_part)
  lo = start.word_lo + delta
  (mul_0, inc_0), (mul_1, inc_1) = keys
  carried = lo < start.word_lo
  return noise_lib.hash_word(jnp.where(carried, mul_1, mul_0), jnp.where(carried, inc_1, inc_0),
                             lo)


# Bit patterns of +1.0 in each matrix-unit dtype, and the sign bit's position.
_ONE_BITS = {
    jnp.dtype(jnp.float32): (0x3F800000, 31, jnp.uint32),
    jnp.dtype(jnp.bfloat16): (0x3F80, 15, jnp.uint16),
    jnp.dtype(jnp.float16): (0x3C00, 15, jnp.uint16),
}


def _bit_at(words: jax.Array, lane: jax.Array | int, position: int) -> jax.Array:
  """Bit ``lane`` of ``words`` moved to bit ``position``, every other bit zero (uint32).

  A static ``lane`` takes one shift and a mask.
  """
  if isinstance(lane, int):
    moved = (words << _U32(position - lane) if lane <= position
             else words >> _U32(lane - position))
    return moved & _U32(1 << position)
  return ((words >> lane) & _U32(1)) << _U32(position)


def _flip_signs(value: jax.Array, sign_bits: jax.Array) -> jax.Array:
  """float32 ``value`` with its sign flipped where ``sign_bits`` has bit 31 set.

  ``value * (+-1)`` for a 32-values-per-word kind, as one xor.
  """
  return jax.lax.bitcast_convert_type(
      jax.lax.bitcast_convert_type(value, _U32) ^ sign_bits, _F32)


def _signs(sign_bits: jax.Array, dtype) -> jax.Array:
  """``-1.0`` where ``sign_bits`` (uint32) has the dtype's sign bit set, else ``+1.0``.

  Integer operations only: no int-to-float or float-to-float conversion, whose
  throughput is a quarter of the integer units' on the GPU.
  """
  one, _, int_dtype = _ONE_BITS[jnp.dtype(dtype)]
  pattern = sign_bits | _U32(one)
  return jax.lax.bitcast_convert_type(pattern.astype(int_dtype), dtype)


def _columns(n_cols: int, transposed: bool) -> jax.Array:
  """uint32 iota over a tile's columns: ``(1, n_cols)``, or ``(n_cols, 1)`` when transposed."""
  if transposed:
    return jax.lax.broadcasted_iota(_U32, (n_cols, 1), 0)
  return jax.lax.broadcasted_iota(_U32, (1, n_cols), 1)


def noise_tile(layout: NoiseLayout, keys, start: _RowStart, col0, n_rows: int, n_cols: int,
               dtype=_F32, *, transposed: bool = False) -> jax.Array:
  """Noise operand of columns ``[col0, col0 + n_cols)`` of a row tile.

  Args:
    layout: the block's layout.
    keys: from :func:`_stream_keys`.
    start: from :func:`_row_start` for the tile's rows.
    col0: first column (int32 scalar; a multiple of 32 for packed kinds).
    n_rows: rows in the tile.
    n_cols: columns in the tile (a multiple of 32 for packed kinds).
    dtype: float32, bfloat16 or float16 (the matrix units' input dtype).
    transposed: build the tile as ``(n_cols, n_rows)``; ``start`` and
      ``keys`` must then be ``(1, n_rows)`` rows (``_row_start`` of
      ``rows[None, :]``). Same values, no transpose in the kernel.

  Returns:
    ``(n_rows, n_cols)`` of ``dtype`` (``(n_cols, n_rows)`` transposed): the
    integer-valued ``q`` of the kind (times its scale for float16, which
    cannot hold ``q``; see :func:`_noise_factor`).
  """
  kind = layout.kind
  col0 = col0.astype(_U32) if hasattr(col0, "astype") else _U32(col0)
  if kind.values_per_word == 1:
    delta = col0 + _columns(n_cols, transposed)
    q = kind.unscaled(_words(layout, keys, start, delta))
    if _prescaled(dtype):
      q = q * _F32(kind.scale)
    return q.astype(dtype)
  # Same values as kind.unscaled (1 - 2 * bit), built without conversions.
  sign_bits = packed_sign_bits(layout, keys, start, col0 >> _U32(kind.log2_values_per_word),
                               n_rows, n_cols, _ONE_BITS[jnp.dtype(dtype)][1],
                               transposed=transposed)
  return _signs(sign_bits, dtype)


def packed_sign_bits(layout: NoiseLayout, keys, start: _RowStart, word0, n_rows: int,
                     n_cols: int, position: int, *, transposed: bool = False) -> jax.Array:
  """A 32-values-per-word kind's bits at ``position``: uint32 ``(n_rows, n_cols)``.

  Columns ``[32 * word0, 32 * word0 + n_cols)`` of each row (``word0`` a
  uint32 scalar). Each row hashes the words it needs as ``(n_rows, 1)``
  vectors and every element selects its word and lane in two dimensions (no
  3-d ``(rows, words, 32)`` tile and reshape; on an H200 the two forms ran
  within run-to-run noise of each other, and this one is simpler). Rows that
  do not start on a word boundary take each element's bit from one of two
  neighbouring words. ``transposed`` gives ``(n_cols, n_rows)`` (see
  :func:`noise_tile`).
  """
  del n_rows  # The rows are those of ``start``.
  cols = _columns(n_cols, transposed)
  index = cols if layout.aligned else start.lane + cols
  which = index >> _U32(5)
  lane = index & _U32(31)
  n_words = -(-n_cols // 32) + (0 if layout.aligned else 1)
  word = None
  for k in reversed(range(n_words)):
    hashed = _words(layout, keys, start, jnp.full((1, 1), word0 + _U32(k), _U32))
    word = hashed if word is None else jnp.where(which == _U32(k), hashed, word)
  return _bit_at(word, lane, position)


def _vector_noise(kind, seed, offset: int, index: jax.Array, length: int) -> jax.Array:
  """Noise ``q`` at ``offset + index`` (int32 vector), the generic per-element formula."""
  layout = NoiseLayout.of_block(kind, offset, 1, length)
  offset_hi, offset_lo = noise_lib.split_u64(offset)
  hi, lo = noise_lib.add_wide(jnp.zeros_like(index, _U32), index.astype(_U32), _U32(offset_hi),
                              _U32(offset_lo))
  return noise_lib.unscaled_noise(seed, hi, lo, kind, high_word=layout.high_word)


def _dot(a, b, contract_b: int, tf32: bool):
  """``a @ b^T`` (``contract_b=1``) or ``a @ b`` (``contract_b=0``) with f32 accumulation."""
  precision = None if (tf32 or a.dtype != _F32) else jax.lax.Precision.HIGHEST
  return jax.lax.dot_general(a, b, (((1,), (contract_b,)), ((), ())),
                             preferred_element_type=_F32, precision=precision)


def _prescaled(dtype) -> bool:
  """float16 cannot hold the integer-valued q (up to 2**24 and beyond): scale first."""
  return jnp.dtype(dtype) == jnp.dtype(jnp.float16)


def _noise_factor(sigma_ref, kind, dtype=_F32) -> jax.Array:
  """The factor applied to accumulated noise products: sigma times the kind's scale."""
  if _prescaled(dtype):
    return sigma_ref[0]
  return sigma_ref[0] * _F32(kind.scale)


# ----------------------------------------------------------------------------
# Perturbed linear: forward.
#
# The unperturbed part ``x @ W^T + b`` is one XLA GEMM (the "GEMM floor"); the
# kernel adds ``sigma * s_i * (x_i @ N_i^T + nb_i)``, so it never reads W.


def _forward_kernel(x_ref, base_ref, seeds_ref, sigma_ref, out_ref, *, layout: NoiseLayout,
                    bias_offset: int, has_bias: bool, shared_x: bool, antithetic: bool,
                    batch: int, out_features: int, in_features: int,
                    config: config_lib.PerturbedLinearConfig):
  block_batch, block_out, block_in = config.block_batch, config.block_out, config.block_in
  pair = 2 if antithetic else 1
  first = pl.program_id(0) * pair
  batch0 = pl.program_id(1) * block_batch
  out0 = pl.program_id(2) * block_out
  dot_dtype = x_ref.dtype
  seed = seeds_ref[first]

  rows = out0 + jax.lax.iota(jnp.int32, block_out)
  batch_rows = batch0 + jax.lax.iota(jnp.int32, block_batch)
  # The product is x @ N^T: with transposed_noise the tile is built as N^T
  # (rows of N along its second axis), so the kernel holds no transpose.
  transposed = config.transposed_noise
  start = _row_start(layout, rows.astype(_U32)[None, :] if transposed
                     else rows.astype(_U32)[:, None])
  keys = _stream_keys(layout, seed, start)
  batch_ok = batch_rows[:, None] < batch
  # With shared x both members of a pair see the same input: one product.
  n_inputs = 1 if shared_x else pair

  def body(step, accs):
    col0 = step * block_in
    cols_ok = (col0 + jax.lax.iota(jnp.int32, block_in))[None, :] < in_features
    noise = noise_tile(layout, keys, start, col0, block_out, block_in, dot_dtype,
                       transposed=transposed)
    new = []
    for member in range(n_inputs):
      index = (pl.ds(batch0, block_batch), pl.ds(col0, block_in))
      ref = x_ref.at[index] if shared_x else x_ref.at[(first + member,) + index]
      x_tile = _pallas.load(ref, mask=batch_ok & cols_ok, other=0)
      new.append(accs[member] + _dot(x_tile, noise, 0 if transposed else 1, config.tf32))
    return tuple(new)

  zeros = tuple(jnp.zeros((block_batch, block_out), _F32) for _ in range(n_inputs))
  accs = jax.lax.fori_loop(0, pl.cdiv(in_features, block_in), body, zeros)

  factor = _noise_factor(sigma_ref, layout.kind, dot_dtype)
  out_ok = batch_ok & (rows[None, :] < out_features)
  bias_noise = 0.0
  if has_bias:
    bias_noise = _vector_noise(layout.kind, seed, bias_offset, rows, out_features)[None, :]
    if _prescaled(dot_dtype):
      bias_noise = bias_noise * _F32(layout.kind.scale)
  for member in range(pair):
    sign = 1.0 - 2.0 * member
    index = (pl.ds(batch0, block_batch), pl.ds(out0, block_out))
    base_index = index if shared_x else (first + member,) + index
    base = _pallas.load(base_ref.at[base_index], mask=out_ok, other=0)
    value = base + (sign * factor) * (accs[member % n_inputs] + bias_noise)
    _pallas.store(out_ref.at[(first + member,) + index], value.astype(out_ref.dtype),
                  mask=out_ok)


def perturbed_linear(x, weight, bias, seeds, sigma, offset, *, kind, antithetic, out_dtype,
                     config=None, interpret=False):
  """Kernel path of :func:`jaxnoise.virtual_perturbed_linear` (inputs validated)."""
  pop = seeds.shape[0]
  out_features, in_features = weight.shape
  shared_x = x.ndim == 2
  batch = x.shape[-2]
  # With shared x both members of an antithetic pair see the same product.
  products = 1 if shared_x or not antithetic else 2
  if config is None:
    config = config_lib.perturbed_linear_heuristics(batch, out_features, in_features, kind,
                                                    products)
  config = config.validate()
  layout = NoiseLayout.of_block(kind, offset, out_features, in_features)
  precision = None if config.tf32 else jax.lax.Precision.HIGHEST
  base = jnp.einsum("...bk,ok->...bo", x, weight.astype(x.dtype) if x.dtype != _F32 else weight,
                    preferred_element_type=_F32, precision=precision)
  if bias is not None:
    base = base + bias.astype(_F32)
  kernel = functools.partial(
      _forward_kernel, layout=layout, bias_offset=offset + out_features * in_features,
      has_bias=bias is not None, shared_x=shared_x, antithetic=antithetic, batch=batch,
      out_features=out_features, in_features=in_features, config=config)
  grid = (pop // 2 if antithetic else pop, pl.cdiv(batch, config.block_batch),
          pl.cdiv(out_features, config.block_out))
  call = _pallas.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((pop, batch, out_features), out_dtype),
      grid=grid,
      interpret=interpret,
      compiler_params=_pallas.compiler_params(config.num_warps,
                                              config.stages(x.dtype.itemsize, products)),
      name="virtual_perturbed_linear",
  )
  return call(x, base, seeds, jnp.reshape(sigma, (1,)).astype(_F32))


# ----------------------------------------------------------------------------
# Perturbed linear: gradient with respect to x.
#
# dX_i = G_i W + sigma s_i G_i N_i. The first term is an XLA GEMM; the kernel
# computes the second, for one individual (or pair) per program, or summed
# over a share of the population when x is shared.


def _input_grad_kernel(grad_ref, seeds_ref, sigma_ref, out_ref, *, layout: NoiseLayout,
                       shared_x: bool, antithetic: bool, batch: int, out_features: int,
                       in_features: int, per_split: int,
                       config: config_lib.PerturbedLinearConfig):
  block_batch, block_out, block_in = config.block_batch, config.block_out, config.block_in
  batch0 = pl.program_id(1) * block_batch
  col0 = pl.program_id(2) * block_in
  batch_ok = (batch0 + jax.lax.iota(jnp.int32, block_batch))[:, None] < batch
  cols_ok = (col0 + jax.lax.iota(jnp.int32, block_in))[None, :] < in_features
  dot_dtype = grad_ref.dtype
  n_out_steps = pl.cdiv(out_features, block_out)
  factor = _noise_factor(sigma_ref, layout.kind, dot_dtype)

  def noise_for(seed, out0):
    rows = out0 + jax.lax.iota(jnp.int32, block_out)
    start = _row_start(layout, rows.astype(_U32)[:, None])
    keys = _stream_keys(layout, seed, start)
    return rows, noise_tile(layout, keys, start, col0, block_out, block_in, dot_dtype)

  def load_grad(individual, out0, rows):
    ref = grad_ref.at[individual, pl.ds(batch0, block_batch), pl.ds(out0, block_out)]
    return _pallas.load(ref, mask=batch_ok & (rows[None, :] < out_features), other=0)

  out_index = (pl.ds(batch0, block_batch), pl.ds(col0, block_in))
  if shared_x:
    # Sum over this program's share of the population (pairs already folded,
    # population zero-padded to whole shares).
    first = pl.program_id(0) * per_split

    def over_individuals(position, acc):
      individual = first + position
      seed = seeds_ref[individual]

      def over_out(step, acc_inner):
        rows, noise = noise_for(seed, step * block_out)
        return acc_inner + _dot(load_grad(individual, step * block_out, rows), noise, 0,
                                config.tf32)

      return jax.lax.fori_loop(0, n_out_steps, over_out, acc)

    acc = jax.lax.fori_loop(0, per_split, over_individuals,
                            jnp.zeros((block_batch, block_in), _F32))
    _pallas.store(out_ref.at[(pl.program_id(0),) + out_index], factor * acc,
                  mask=batch_ok & cols_ok)
    return

  pair = 2 if antithetic else 1
  first = pl.program_id(0) * pair
  seed = seeds_ref[first]

  def body(step, accs):
    rows, noise = noise_for(seed, step * block_out)
    return tuple(accs[member] + _dot(load_grad(first + member, step * block_out, rows), noise, 0,
                                     config.tf32) for member in range(pair))

  zeros = tuple(jnp.zeros((block_batch, block_in), _F32) for _ in range(pair))
  accs = jax.lax.fori_loop(0, n_out_steps, body, zeros)
  for member in range(pair):
    sign = 1.0 - 2.0 * member
    _pallas.store(out_ref.at[(first + member,) + out_index], (sign * factor) * accs[member],
                  mask=batch_ok & cols_ok)


def perturbed_linear_input_grad(grad_out, weight, seeds, sigma, offset, *, kind, antithetic,
                                shared_x, config=None, interpret=False):
  """``dX[i] = G[i] @ (W + sigma s_i N_i)`` (summed over ``i`` for shared x), float32."""
  pop, batch, out_features = grad_out.shape
  in_features = weight.shape[1]
  if config is None:
    config = config_lib.input_grad_heuristics(batch, out_features, in_features, kind)
  config = config.validate()
  layout = NoiseLayout.of_block(kind, offset, out_features, in_features)
  grad_out = grad_out.astype(_F32)
  precision = None if config.tf32 else jax.lax.Precision.HIGHEST
  n_batch_tiles = pl.cdiv(batch, config.block_batch)
  n_in_tiles = pl.cdiv(in_features, config.block_in)
  # Per-individual x loads both members' output gradients per step.
  tiles_per_stage = 2 if antithetic and not shared_x else 1
  params = _pallas.compiler_params(config.num_warps, config.input_grad_stages(tiles_per_stage))
  common = dict(layout=layout, shared_x=shared_x, antithetic=antithetic, batch=batch,
                out_features=out_features, in_features=in_features, config=config)
  sigma = jnp.reshape(sigma, (1,)).astype(_F32)
  name = "virtual_perturbed_linear_input_grad"
  if shared_x:
    weight_part = jnp.dot(grad_out.sum(0), weight.astype(_F32), precision=precision)
    if antithetic:
      grad_out, seeds = grad_out[0::2] - grad_out[1::2], seeds[0::2]
    n_individuals = grad_out.shape[0]
    tiles = n_batch_tiles * n_in_tiles
    splits = max(1, min(n_individuals, config_lib.TARGET_PROGRAMS // max(1, tiles)))
    per_split = -(-n_individuals // splits)
    splits = -(-n_individuals // per_split)
    pad = splits * per_split - n_individuals
    grad_out = jnp.pad(grad_out, ((0, pad), (0, 0), (0, 0)))
    seeds = jnp.pad(seeds, (0, pad))
    kernel = functools.partial(_input_grad_kernel, per_split=per_split, **common)
    partial = _pallas.pallas_call(
        kernel, out_shape=jax.ShapeDtypeStruct((splits, batch, in_features), _F32),
        grid=(splits, n_batch_tiles, n_in_tiles), interpret=interpret,
        compiler_params=params, name=name,
    )(grad_out, seeds, sigma)
    return weight_part + partial.sum(0)
  weight_part = jnp.einsum("pbo,ok->pbk", grad_out, weight.astype(_F32), precision=precision)
  kernel = functools.partial(_input_grad_kernel, per_split=1, **common)
  noise_part = _pallas.pallas_call(
      kernel, out_shape=jax.ShapeDtypeStruct((pop, batch, in_features), _F32),
      grid=(pop // 2 if antithetic else pop, n_batch_tiles, n_in_tiles), interpret=interpret,
      compiler_params=params, name=name,
  )(grad_out, seeds, sigma)
  return weight_part + noise_part


# ----------------------------------------------------------------------------
# Flat parameter blocks (gradient estimate, reduce-metric).
#
# A flat block of n elements at index ``offset`` is tiled in rows of 32
# starting at the word-aligned index ``offset - offset % 32``, so a
# "rademacher" word never straddles rows; positions before ``offset`` and
# after the end are padding.


def _flat_geometry(offset: int, n_elements: int):
  """Word-aligned flat tiling: ``(aligned offset, leading pad, rows of 32)``."""
  lead = offset % 32
  rows = -(-(n_elements + lead) // 32)
  return offset - lead, lead, rows


def _individual_keys(layout: NoiseLayout, seeds: jax.Array):
  """Per-individual stream keys (computed once, by XLA) when no high word is needed."""
  if layout.high_word:
    return seeds, seeds
  return noise_lib.stream_keys(seeds, _U32(0))


def _noise_gradient_kernel(fitness_ref, seeds_or_mul_ref, increment_ref, out_ref, *,
                           layout: NoiseLayout, per_split: int, n_rows: int, block_rows: int,
                           unroll: int, lane_accumulators: bool):
  row0 = pl.program_id(0) * block_rows
  rows = row0 + jax.lax.iota(jnp.int32, block_rows)
  start = _row_start(layout, rows.astype(_U32)[:, None])
  first = pl.program_id(1) * per_split

  def individuals(step):
    """``(fitness, keys)`` of the ``unroll`` individuals of one loop step."""
    for member in range(unroll):
      individual = first + step * unroll + member
      if layout.high_word:
        keys = _stream_keys(layout, seeds_or_mul_ref[individual], start)
      else:
        keys = (seeds_or_mul_ref[individual], increment_ref[individual])
      yield fitness_ref[individual], keys

  packed = layout.kind.values_per_word == 32
  if packed and lane_accumulators:
    # One row of the tile is one word. Keeping the 32 lanes as 32 column
    # accumulators lets each thread hash only the words of its own rows (a
    # (rows, 32) tile spreads a row over several threads, which would each
    # hash it).

    def packed_body(step, accs):
      accs = list(accs)
      for fitness, keys in individuals(step):
        words = _words(layout, keys, start, jnp.zeros((1, 1), _U32))
        for lane in range(32):
          accs[lane] = accs[lane] + _flip_signs(fitness, _bit_at(words, lane, 31))
      return tuple(accs)

    zeros = tuple(jnp.zeros((block_rows, 1), _F32) for _ in range(32))
    accs = jax.lax.fori_loop(0, per_split // unroll, packed_body, zeros)
    lanes = jax.lax.broadcasted_iota(jnp.int32, (1, 32), 1)
    acc = jnp.zeros((block_rows, 32), _F32)
    for lane in range(32):
      acc = jnp.where(lanes == lane, accs[lane], acc)
  else:

    def body(step, acc):
      for fitness, keys in individuals(step):
        if packed:
          flips = packed_sign_bits(layout, keys, start, _U32(0), block_rows, 32, 31)
          acc = acc + _flip_signs(fitness, flips)
        else:
          acc = acc + fitness * noise_tile(layout, keys, start, 0, block_rows, 32)
      return acc

    acc = jax.lax.fori_loop(0, per_split // unroll, body, jnp.zeros((block_rows, 32), _F32))
  _pallas.store(out_ref.at[pl.program_id(1), pl.ds(row0, block_rows), :], acc,
                mask=(rows < n_rows)[:, None])


def noise_gradient(fitness, seeds, shape, sigma, pop_size, offset, *, kind, antithetic,
                   config=None, interpret=False):
  """Kernel path of the weight / bias gradient estimates (inputs validated).

  Each element's sum over one population share is the kernel's loop (one
  multiply-add per individual, in order); the shares are added by a fixed
  tree. The weights carry every scale, so nothing is multiplied afterwards:
  an element's bits do not depend on the block's size (a row shard,
  :mod:`jaxnoise.parallel`, equals those rows of the whole block).
  """
  fitness, seeds = reference.scaled_weights(fitness, seeds, antithetic, sigma, pop_size,
                                            kind.scale, apart=interpret)
  n_individuals = seeds.shape[0]
  n_elements = 1
  for dim in shape:
    n_elements *= dim
  base, lead, n_rows = _flat_geometry(offset, n_elements)
  if config is None:
    config = config_lib.noise_gradient_heuristics(n_elements, n_individuals, kind)
  config = config.validate()
  block_rows = min(config.block_rows, config_lib.next_pow2(n_rows))
  splits = max(1, min(config.pop_splits or 1, n_individuals))
  unroll = config.individuals_per_step
  per_split = -(-n_individuals // splits)
  per_split = -(-per_split // unroll) * unroll
  splits = -(-n_individuals // per_split)
  # Zero fitness pads the population to whole shares: a static trip count.
  pad = splits * per_split - n_individuals
  fitness = jnp.pad(fitness, (0, pad))
  layout = NoiseLayout.of_block(kind, base, n_rows, 32)
  keys = _individual_keys(layout, jnp.pad(seeds, (0, pad)))
  kernel = functools.partial(_noise_gradient_kernel, layout=layout, per_split=per_split,
                             n_rows=n_rows, block_rows=block_rows, unroll=unroll,
                             lane_accumulators=config.lane_accumulators)
  partial = _pallas.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((splits, n_rows, 32), _F32),
      grid=(pl.cdiv(n_rows, block_rows), splits),
      interpret=interpret,
      compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
      name="virtual_noise_gradient",
  )(fitness, *keys)
  # The population shares are added by a fixed tree (not XLA's reduce, whose order
  # follows the shape): an element's sum does not depend on the block's size.
  total = _common.pairwise_sum(partial).reshape(-1)[lead:lead + n_elements]
  return total.reshape(shape)


def _reduce_metric_kernel(center_ref, seeds_ref, sigma_ref, *out_refs, layout: NoiseLayout,
                          antithetic: bool, n_individuals: int, lead: int, n_params: int,
                          tiles_per_split: int, config: config_lib.ReduceMetricConfig):
  block_rows, group = config.block_rows, config.individuals_per_program
  first = pl.program_id(0) * group
  first_row = pl.program_id(1) * tiles_per_split * block_rows
  factor = _noise_factor(sigma_ref, layout.kind)
  seeds = [seeds_ref[jnp.minimum(first + member, n_individuals - 1)] for member in range(group)]
  signs = (1.0, -1.0) if antithetic else (1.0,)
  if not layout.high_word:
    hoisted = [noise_lib.stream_keys(seed, _U32(0)) for seed in seeds]

  def body(position, accs):
    row0 = first_row + position * block_rows
    rows = row0 + jax.lax.iota(jnp.int32, block_rows)
    start = _row_start(layout, rows.astype(_U32)[:, None])
    element = rows[:, None] * 32 + jax.lax.broadcasted_iota(jnp.int32, (1, 32), 1)
    valid = (element >= lead) & (element < lead + n_params)
    center = _pallas.load(center_ref.at[pl.ds(row0, block_rows), :])
    new = []
    for member in range(group):
      keys = hoisted[member] if not layout.high_word else _stream_keys(layout, seeds[member],
                                                                        start)
      if layout.kind.values_per_word == 32:
        flips = packed_sign_bits(layout, keys, start, _U32(0), block_rows, 32, 31)
        step = _flip_signs(factor, flips)
      else:
        step = factor * noise_tile(layout, keys, start, 0, block_rows, 32)
      for sign_index, sign in enumerate(signs):
        value = jnp.where(valid, jnp.abs(center + sign * step), 0.0)
        new.append(accs[member * len(signs) + sign_index] + value)
    return tuple(new)

  zeros = tuple(jnp.zeros((block_rows, 32), _F32) for _ in range(group * len(signs)))
  accs = jax.lax.fori_loop(0, tiles_per_split, body, zeros)
  members = jax.lax.iota(jnp.int32, group)
  for sign_index, out_ref in enumerate(out_refs):
    totals = jnp.zeros((group,), _F32)
    for member in range(group):
      totals = jnp.where(members == member, jnp.sum(accs[member * len(signs) + sign_index]),
                         totals)
    _pallas.store(out_ref.at[pl.program_id(1), pl.ds(first, group)], totals,
                  mask=first + members < n_individuals)


def _reduce_metric_individuals_kernel(center_ref, seeds_ref, sigma_ref, *out_refs,
                                      kind: noise_lib.NoiseKind, word_hi: int, word_lo: int,
                                      antithetic: bool, n_individuals: int, start: int,
                                      n_params: int, tiles_per_split: int, compiled: bool,
                                      config: config_lib.ReduceMetricConfig):
  """``(individuals, parameters)`` tiles of ``center[start:start + n_params]``.

  The range has a constant high word; element ``(i, k)`` hashes word
  ``word_lo + k`` of individual ``i``'s stream.
  ``(word_lo + p0 + j) * m + c == j * m + ((word_lo + p0) * m + c)`` (mod
  2**32): the ``(rows, block_params)`` product ``j * m`` is loop-invariant, so
  each element costs one add before the finaliser (same bits as
  :func:`jaxnoise.noise.hash_word`).

  A range of whole tiles (``n_params`` a multiple of ``block_params``) is
  read and summed without masks, the last split taking fewer tiles; a ragged
  range is one masked tile. Compiled, ``center + sigma * noise`` is one fused
  multiply-add (:func:`jaxnoise.ops._pallas.fma`), a rounding the interpreter's
  multiply then add can differ from in the last bit; for ``"binomial"`` it is
  taken on :func:`_binomial_unit` against the centre shifted once per tile (a
  different rounding of the same value, within the metric's float32 sums).
  """
  group, block_params = config.individuals_per_program, config.block_params
  first = pl.program_id(0) * group
  members = first + jax.lax.iota(jnp.int32, group)
  seeds = _pallas.load(seeds_ref.at[pl.ds(first, group)], mask=members < n_individuals, other=0)
  multiplier, increment = noise_lib.stream_keys(seeds[:, None], _U32(word_hi))
  columns = jax.lax.broadcasted_iota(jnp.int32, (1, block_params), 1)
  column_part = columns.astype(_U32) * multiplier
  factor = _noise_factor(sigma_ref, kind)
  factors = (factor, -factor) if antithetic else (factor,)
  binomial = kind.name == "binomial"
  if binomial:
    # center + factor * q == (center - 48 factor) + 32 factor * unit (q = 32 unit - 48):
    # per value one fused multiply-add on the unit, the centre's shift once per tile.
    affine = [(_F32(32.0) * f, _F32(-48.0) * f) for f in factors]
  first_tile = pl.program_id(1) * tiles_per_split
  masked = n_params % block_params != 0
  n_tiles = pl.cdiv(n_params, block_params)

  def body(position, accs):
    p0 = (first_tile + position) * block_params
    window = center_ref.at[pl.ds(start + p0, block_params)]
    if masked:
      valid = (p0 + columns) < n_params
      center = _pallas.load(window, mask=valid[0], other=0.0)
    else:
      center = _pallas.load(window)
    tile_part = (_U32(word_lo) + p0.astype(_U32)) * multiplier + increment
    words = noise_lib.mix32(column_part + tile_part)
    if binomial:
      unit = _binomial_unit(words)
      terms = [(slope, unit, (center + shift)[None, :]) for slope, shift in affine]
    else:
      q = kind.unscaled(words)
      terms = [(f, q, center[None, :]) for f in factors]
    new = []
    for acc, (a, b, c) in zip(accs, terms):
      value = jnp.abs(_pallas.fma(a, b, c, compiled=compiled))
      new.append(acc + (jnp.where(valid, value, 0.0) if masked else value))
    return tuple(new)

  zeros = tuple(jnp.zeros((group, block_params), _F32) for _ in factors)
  # The last split may hold fewer tiles.
  steps = jnp.minimum(tiles_per_split, n_tiles - first_tile)
  accs = jax.lax.fori_loop(0, steps, body, zeros)
  for acc, out_ref in zip(accs, out_refs):
    _pallas.store(out_ref.at[pl.program_id(1), pl.ds(first, group)], jnp.sum(acc, axis=1),
                  mask=members < n_individuals)


def _binomial_unit(words: jax.Array) -> jax.Array:
  """float32 ``1 + popcount(words) / 32``, exact: the "binomial" ``q`` is ``32 unit - 48``.

  Its bits are ``0x3F800000 + (popcount << 18)`` (a count of 32 carries into
  the exponent: 2.0): one shift-add on the count (``LEA``) where
  ``kind.unscaled`` takes an ``or`` and a float subtraction. On an H200 the
  reduce-metric took 3-5% less time with it (``benchmarks/RESULTS.md``,
  session 17).
  """
  count = jax.lax.population_count(jax.lax.bitcast_convert_type(words, jnp.int32))
  return jax.lax.bitcast_convert_type(count * (1 << 18) + 0x3F800000, _F32)


def _constant_high_word_segments(offset: int, n_params: int):
  """``[(start, length, word_hi, word_lo)]``: pieces of ``[0, n_params)`` whose
  indices ``offset + k`` share one high word (at most two below 2**32 params)."""
  segments, start = [], 0
  while start < n_params:
    index = offset + start
    length = min(n_params - start, (1 << 32) - (index & 0xFFFFFFFF))
    segments.append((start, length, (index >> 32) & 0xFFFFFFFF, index & 0xFFFFFFFF))
    start += length
  return segments


def _reduce_metric_individuals(center, seeds, sigma, offset, *, kind, antithetic, config,
                               interpret):
  """Per-sign sums ``sum_k |center[k] + sigma noise[i, k]|`` of the ``"individuals"`` layout."""
  if kind.values_per_word != 1:
    raise ValueError(f'ReduceMetricConfig(layout="individuals") needs a kind with one value '
                     f'per word, got kind {kind.name!r}')
  n_individuals = seeds.shape[0]
  group, block_params = config.individuals_per_program, config.block_params
  n_groups = pl.cdiv(n_individuals, group)
  padded_seeds = jnp.pad(seeds, (0, n_groups * group - n_individuals))
  sigma = jnp.reshape(sigma, (1,)).astype(_F32)
  n_outputs = 2 if antithetic else 1
  totals = None
  for start, length, word_hi, word_lo in _constant_high_word_segments(offset, center.shape[0]):
    segment = center[start:start + length].astype(_F32)
    whole = length - length % block_params
    # The whole tiles unmasked, then the ragged rest as one masked tile.
    for part_start, part_length in ((0, whole), (whole, length - whole)):
      if not part_length:
        continue
      n_tiles = pl.cdiv(part_length, block_params)
      splits = max(1, min(config.param_splits or 1, n_tiles))
      tiles_per_split = -(-n_tiles // splits)
      splits = -(-n_tiles // tiles_per_split)
      kernel = functools.partial(
          _reduce_metric_individuals_kernel, kind=kind, word_hi=word_hi,
          word_lo=word_lo + part_start, antithetic=antithetic, n_individuals=n_individuals,
          start=part_start, n_params=part_length, tiles_per_split=tiles_per_split,
          compiled=not interpret, config=config)
      sums = _pallas.pallas_call(
          kernel,
          out_shape=[jax.ShapeDtypeStruct((splits, n_groups * group), _F32)] * n_outputs,
          grid=(n_groups, splits),
          interpret=interpret,
          compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
          name="virtual_reduce_metric",
      )(segment, padded_seeds, sigma)
      sums = [s.sum(0)[:n_individuals] for s in sums]
      totals = sums if totals is None else [a + b for a, b in zip(totals, sums)]
  return totals


def reduce_metric(center, seeds, sigma, offset, *, kind, antithetic, config=None,
                  interpret=False):
  """Kernel path of :func:`jaxnoise.virtual_reduce_metric` (inputs validated)."""
  pop = seeds.shape[0]
  n_params = center.shape[0]
  if antithetic:
    seeds = seeds[0::2]
  n_individuals = seeds.shape[0]
  base, lead, n_rows = _flat_geometry(offset, n_params)
  if config is None:
    config = config_lib.reduce_metric_heuristics(n_params, n_individuals, kind)
  config = config.validate()
  if config.layout == "individuals":
    per_sign = [s / _F32(n_params) for s in _reduce_metric_individuals(
        center, seeds, sigma, offset, kind=kind, antithetic=antithetic, config=config,
        interpret=interpret)]
    if antithetic:
      return jnp.stack(per_sign, axis=1).reshape(pop)
    return per_sign[0]
  block_rows = min(config.block_rows, config_lib.next_pow2(n_rows))
  config = dataclasses.replace(config, block_rows=block_rows)
  n_tiles = pl.cdiv(n_rows, block_rows)
  splits = max(1, min(config.param_splits or 1, n_tiles))
  tiles_per_split = -(-n_tiles // splits)
  splits = -(-n_tiles // tiles_per_split)
  group = config.individuals_per_program
  n_groups = pl.cdiv(n_individuals, group)
  # Left-pad to the word-aligned start, right-pad to whole tiles (a static trip count).
  padded_rows = splits * tiles_per_split * block_rows
  padded = jnp.pad(center.astype(_F32), (lead, padded_rows * 32 - lead - n_params))
  layout = NoiseLayout.of_block(kind, base, padded_rows, 32)
  kernel = functools.partial(
      _reduce_metric_kernel, layout=layout, antithetic=antithetic, n_individuals=n_individuals,
      lead=lead, n_params=n_params, tiles_per_split=tiles_per_split, config=config)
  n_outputs = 2 if antithetic else 1
  out_shape = [jax.ShapeDtypeStruct((splits, n_groups * group), _F32)] * n_outputs
  sums = _pallas.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=(n_groups, splits),
      interpret=interpret,
      compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
      name="virtual_reduce_metric",
  )(padded.reshape(padded_rows, 32), seeds, jnp.reshape(sigma, (1,)).astype(_F32))
  per_sign = [s.sum(0)[:n_individuals] / _F32(n_params) for s in sums]
  if antithetic:
    return jnp.stack(per_sign, axis=1).reshape(pop)
  return per_sign[0]

