"""Frozen copy of the counter update on a dense gradient as it was at 7fbab3d, self-contained.

The kernel of :func:`jaxnoise.ops.ternary.pallas_triton_update.counter_update`
before it took fewer instructions (session 16), with every helper it calls
from ``pallas_triton``, ``reference`` and ``noise`` copied as they were, so
today's kernel can be checked (``check_counter_update.py``) and timed
(``bench_ternary.py --part update --before-update``) against it bit for bit.
Only the config and the ``pallas_call`` wrapper are imported. Not part of the
library.

The module is loaded from its path (``_harness.frozen_module``) or imported as
``benchmarks.baseline_update.update_7fbab3d``; it imports ``jaxnoise``
absolutely, so run from the repository root (or with it on ``PYTHONPATH``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxnoise.ops import _pallas
from jaxnoise.ops.ternary.config import CounterUpdateConfig, check_config

__all__ = ["counter_update"]

_F32 = jnp.float32
_I32 = jnp.int32
_U32 = jnp.uint32

# ----------------------------------------------------------------------------
# jaxnoise.noise (the hash of the rounding draw).

_MIX_MUL_1 = 0x7FEB352D
_MIX_MUL_2 = 0x846CA68B
_GOLDEN = 0x9E3779B9
_HI_SALT = 0x632BE5AB
_MULTIPLIER_SALT = 0x3C6EF372
_INCREMENT_SALT = 0xA54FF53A


def mix32(x):
  x = x ^ (x >> 16)
  x = x * _U32(_MIX_MUL_1)
  x = x ^ (x >> 15)
  x = x * _U32(_MIX_MUL_2)
  return x ^ (x >> 16)


def stream_keys(seed, word_hi):
  h = mix32(word_hi * _U32(_GOLDEN) + _U32(_HI_SALT))
  k = mix32(seed ^ h)
  multiplier = mix32(k + _U32(_MULTIPLIER_SALT)) | _U32(1)
  increment = mix32(k ^ _U32(_INCREMENT_SALT))
  return multiplier, increment


def hash_word(multiplier, increment, word_lo):
  return mix32(word_lo * multiplier + increment)


def mul_wide(a, b):
  a = jnp.asarray(a, _U32)
  b = jnp.asarray(b, _U32)
  mask = _U32(0xFFFF)
  a_lo, a_hi = a & mask, a >> 16
  b_lo, b_hi = b & mask, b >> 16
  p0 = a_lo * b_lo
  p1 = a_lo * b_hi
  p2 = a_hi * b_lo
  p3 = a_hi * b_hi
  mid = (p0 >> 16) + (p1 & mask) + (p2 & mask)
  lo = (p0 & mask) | (mid << 16)
  hi = p3 + (p1 >> 16) + (p2 >> 16) + (mid >> 16)
  return hi, lo


def add_wide(a_hi, a_lo, b_hi, b_lo):
  lo = a_lo + b_lo
  carry = (lo < a_lo).astype(_U32)
  return a_hi + b_hi + carry, lo


def row_base(offset, rows, n_cols):
  off_hi, off_lo = (offset >> 32) & 0xFFFFFFFF, offset & 0xFFFFFFFF
  prod_hi, prod_lo = mul_wide(rows, int(n_cols))
  return add_wide(prod_hi, prod_lo, _U32(off_hi), _U32(off_lo))


def uniform01_of_word(word):
  return (word >> 8).astype(jnp.int32).astype(jnp.float32) * jnp.float32(2.0**-24)


def uniform01(seed, index_hi, index_lo, *, high_word=True):
  if not high_word:
    index_hi = jnp.zeros((), _U32)
  multiplier, increment = stream_keys(seed, index_hi)
  return uniform01_of_word(hash_word(multiplier, increment, index_lo))


def uniform01_run(seed, index_lo, n):
  multiplier, increment = stream_keys(seed, jnp.zeros((), _U32))
  base = index_lo * multiplier + increment
  return [uniform01_of_word(mix32(base + _U32(j) * multiplier)) for j in range(n)]


# ----------------------------------------------------------------------------
# jaxnoise.ops.ternary.reference (the element and row formulas).

SCALE_MIN = 1e-5
SCALE_MAX = 10.0
CODES_PER_WORD_GROUP = 16


def levels(C):
  return 2 * C - 1


def pack_group(c0, c1, c2, c3):
  b0 = (c0 | (c1 << 6)) & 0xFF
  b1 = ((c1 >> 2) | (c2 << 4)) & 0xFF
  b2 = ((c2 >> 4) | (c3 << 2)) & 0xFF
  return b0, b1, b2


def unpack_group(b0, b1, b2):
  c0 = b0 & 0x3F
  c1 = ((b0 >> 6) | (b1 << 2)) & 0x3F
  c2 = ((b1 >> 4) | (b2 << 4)) & 0x3F
  c3 = (b2 >> 2) & 0x3F
  return c0, c1, c2, c3


def unpack_words(w0, w1, w2):
  words = (w0, w1, w2)
  codes = []
  for j in range(CODES_PER_WORD_GROUP):
    word, bit = divmod(6 * j, 32)
    value = words[word] >> bit
    if bit > 26:
      value = value | (words[word + 1] << (32 - bit))
    codes.append((value & 0x3F).astype(jnp.int32))
  return codes


def pack_words(codes):
  words = [None, None, None]
  for j, code in enumerate(codes):
    code = code.astype(jnp.uint32)
    word, bit = divmod(6 * j, 32)
    part = code << bit
    words[word] = part if words[word] is None else words[word] | part
    if bit > 26:
      words[word + 1] = code >> (32 - bit)
  return tuple(words)


def is_finite(value):
  return jnp.abs(value) < jnp.inf


def row_update(sum_sq, sum_gt, scale, v, hyper, *, in_features, C, lagged):
  lr, lr_scale, beta, eps = hyper[0], hyper[1], hyper[2], hyper[3]
  lv = levels(C)
  mean_sq = sum_sq * _F32(1.0 / in_features)
  v_new = beta * v + (_F32(1.0) - beta) * mean_sq
  denom = jnp.maximum(jnp.sqrt(v if lagged else v_new), eps)
  grad_scale = sum_gt * _F32(1.0 / math.sqrt(in_features))
  scale_new = jnp.clip(scale - lr_scale * grad_scale, _F32(SCALE_MIN), _F32(SCALE_MAX))
  ratio = scale / scale_new
  step = (lr * _F32(lv)) / denom
  active = (is_finite(sum_sq) & is_finite(sum_gt) & (scale > 0) & is_finite(scale)
            & (v >= 0) & is_finite(v) & is_finite(step) & is_finite(ratio))
  scale_out = jnp.where(active, scale_new, scale)
  v_out = jnp.where(active, v_new, v)
  return scale_out, v_out, ratio, step, active


def code_center(codes, C):
  biased = jax.lax.bitcast_convert_type(codes | 0x4B000000, jnp.float32)
  return biased - _F32(8388608.0 + 1.5 * levels(C) - 0.5)


def tick(codes, grad, u, ratio, step, active, C):
  lv = levels(C)
  center = code_center(codes, C)
  z = ratio * center + _F32(1.5 * lv - 0.5) - step * grad.astype(_F32) + u
  moved = jnp.clip(z, _F32(0.0), _F32(3 * lv - 1)).astype(jnp.int32)
  if active is None:
    return moved
  return jnp.where(active, moved, codes)


def element_index(rows, cols, in_features, high_word):
  rows = rows.astype(jnp.uint32)
  cols = cols.astype(jnp.uint32)
  if not high_word:
    return None, rows * jnp.uint32(in_features) + cols
  base_hi, base_lo = row_base(0, rows, in_features)
  lo = base_lo + cols
  hi = base_hi + (lo < base_lo).astype(jnp.uint32)
  return hi, lo


def rounding_draw(seed, rows, cols, in_features, high_word):
  hi, lo = element_index(rows, cols, in_features, high_word)
  if not high_word:
    return uniform01(seed, jnp.uint32(0), lo, high_word=False)
  return uniform01(seed, hi, lo, high_word=True)


def rounding_draw_run(seed, rows, first_cols, n, in_features, high_word):
  if high_word:
    return [rounding_draw(seed, rows, first_cols + jnp.uint32(j), in_features, True)
            for j in range(n)]
  _, lo = element_index(rows, first_cols, in_features, False)
  return uniform01_run(seed, lo, n)


def needs_high_word(out_features, in_features):
  return out_features * in_features > (1 << 32)


# ----------------------------------------------------------------------------
# jaxnoise.ops.ternary.pallas_triton (tile helpers).


def _cdiv(a, b):
  return -(-a // b)


def _iota(n):
  return jax.lax.broadcasted_iota(_I32, (n,), 0)


def _call(kernel, *, name, grid, out_shape, config, interpret, input_output_aliases=None):
  return _pallas.pallas_call(
      kernel, out_shape=out_shape, grid=grid, input_output_aliases=input_output_aliases or {},
      compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
      interpret=interpret, name=name)


def _load_lanes(ref, row_start, block_rows, group_start, block_groups, n_lanes, mask, other):
  other = None if mask is None else other
  return [
      plgpu.load(ref.at[pl.ds(row_start, block_rows), pl.ds(group_start, block_groups), _I32(k)],
                 mask=mask, other=other)
      for k in range(n_lanes)
  ]


def _store_lanes(ref, row_start, block_rows, group_start, block_groups, values, mask):
  for k, value in enumerate(values):
    plgpu.store(ref.at[pl.ds(row_start, block_rows), pl.ds(group_start, block_groups), _I32(k)],
                value, mask=mask)


def _load_vector(ref, start, size, mask, other):
  return plgpu.load(ref.at[pl.ds(start, size)], mask=mask, other=other)


def _store_vector(ref, start, size, value, mask):
  plgpu.store(ref.at[pl.ds(start, size)], value, mask=mask)


@dataclasses.dataclass(frozen=True)
class UnitLayout:
  words: bool

  @property
  def codes(self):
    return CODES_PER_WORD_GROUP if self.words else 4

  @property
  def dtype(self):
    return jnp.uint32 if self.words else jnp.uint8


def unit_layout(in_features, words=True):
  return UnitLayout(words and in_features % CODES_PER_WORD_GROUP == 0)


def packed_units(packed, layout):
  out_features, n_bytes = packed.shape
  if layout.words:
    return jax.lax.bitcast_convert_type(packed.reshape(out_features, n_bytes // 12, 3, 4),
                                        jnp.uint32)
  return packed.reshape(out_features, n_bytes // 3, 3)


def packed_bytes(units, layout):
  if layout.words:
    units = jax.lax.bitcast_convert_type(units, jnp.uint8)
  return units.reshape(units.shape[0], -1)


def _unit_codes(raw, layout):
  if layout.words:
    return unpack_words(*raw)
  return list(unpack_group(*(b.astype(_I32) for b in raw)))


def load_unit_codes(packed_ref, row_start, block_rows, unit_start, block_units, mask, layout):
  raw = _load_lanes(packed_ref, row_start, block_rows, unit_start, block_units, 3, mask, 0)
  return _unit_codes(raw, layout)


def store_unit_codes(packed_ref, row_start, block_rows, unit_start, block_units, codes, mask,
                     layout):
  if layout.words:
    raw = pack_words(codes)
  else:
    raw = [b.astype(jnp.uint8) for b in pack_group(*codes)]
  _store_lanes(packed_ref, row_start, block_rows, unit_start, block_units, raw, mask)


def split_lanes(tile):
  rows, units, n_lanes = tile.shape
  if n_lanes == 1:
    return [tile.reshape(rows, units)]
  even, odd = jnp.unstack(tile.reshape(rows, units, n_lanes // 2, 2), axis=-1)
  lanes = [None] * n_lanes
  lanes[0::2] = split_lanes(even)
  lanes[1::2] = split_lanes(odd)
  return lanes


def load_dense_lanes(ref, row_start, block_rows, unit_start, block_units, n_lanes, vector, mask,
                     other=0):
  lanes = []
  for first in range(0, n_lanes, vector):
    if vector == 1:
      lanes.append(plgpu.load(
          ref.at[pl.ds(row_start, block_rows), pl.ds(unit_start, block_units), _I32(first)],
          mask=mask, other=other))
      continue
    tile = plgpu.load(ref.at[pl.ds(row_start, block_rows), pl.ds(unit_start, block_units),
                             pl.ds(first, vector)], mask=mask[:, :, None], other=other)
    lanes.extend(split_lanes(tile))
  return lanes


def dense_units(array, codes_per_unit):
  rows, in_features = array.shape
  return array.reshape(rows, in_features // codes_per_unit, codes_per_unit)


# ----------------------------------------------------------------------------
# jaxnoise.ops.ternary.pallas_triton_update (the kernel).


def _read_hyper(hyper_ref):
  return tuple(hyper_ref[k] for k in range(4))


def _tile_stats(codes, grads, C):
  lv = levels(C)
  zero = _F32(0.0)
  squares = sum(g * g for g in grads)
  signed = sum(jnp.where(c >= 2 * lv, g, jnp.where(c >= lv, zero, -g))
               for c, g in zip(codes, grads))
  return jnp.sum(squares, axis=1), jnp.sum(signed, axis=1)


def _tick_lanes(seed, rows, units, codes, grads, ratio, step, *, C, codes_per_unit,
                in_features, high_word):
  rows_u = rows.astype(jnp.uint32)[:, None]
  first_cols = (units * codes_per_unit).astype(jnp.uint32)[None, :]
  draws = rounding_draw_run(seed, rows_u, first_cols, codes_per_unit, in_features, high_word)
  return [tick(code, grad, u, ratio, step, None, C)
          for code, grad, u in zip(codes, grads, draws)]


def _counter_update_kernel(hyper_ref, seed_ref, grad_ref, packed_ref, scale_ref, v_ref,
                           packed_out_ref, scale_out_ref, v_out_ref, skipped_ref, *, C, lagged,
                           layout, n_rows, n_units, block_rows, chunks, loop_units,
                           vector, high_word):
  r0 = pl.program_id(0) * block_rows
  traced_zero = r0 * 0
  rows = r0 + _iota(block_rows)
  row_mask = rows < n_rows
  hyper = _read_hyper(hyper_ref)
  seed = seed_ref[0]
  scale = _load_vector(scale_ref, r0, block_rows, row_mask, 1.0)
  v = _load_vector(v_ref, r0, block_rows, row_mask, 0.0)
  per_unit = layout.codes
  in_features = per_unit * n_units

  def load(u0, size):
    u0 = u0 + traced_zero
    units = u0 + _iota(size)
    mask = row_mask[:, None] & (units < n_units)[None, :]
    codes = load_unit_codes(packed_ref, r0, block_rows, u0, size, mask, layout)
    grads = load_dense_lanes(grad_ref, r0, block_rows, u0, size, per_unit, vector, mask)
    return u0, units, mask, codes, [g.astype(_F32) for g in grads]

  def finish_rows(sum_sq, sum_gt):
    scale_new, v_new, ratio, step, active = row_update(
        sum_sq, sum_gt, scale, v, hyper, in_features=in_features, C=C, lagged=lagged)
    _store_vector(scale_out_ref, r0, block_rows, scale_new, row_mask)
    _store_vector(v_out_ref, r0, block_rows, v_new, row_mask)
    _store_vector(skipped_ref, r0, block_rows, (~active).astype(_I32), row_mask)
    return ratio[:, None], step[:, None], active[:, None]

  def update(size, u0, units, mask, codes, grads, ratio, step, active):
    new_codes = _tick_lanes(seed, rows, units, codes, grads, ratio, step, C=C,
                            codes_per_unit=per_unit, in_features=in_features,
                            high_word=high_word)
    store_unit_codes(packed_out_ref, r0, block_rows, u0, size, new_codes, mask & active, layout)

  if loop_units is None:
    tiles = [(size, *load(u0, size)) for u0, size in chunks]
    sums = [_tile_stats(tile[4], tile[5], C) for tile in tiles]
    ratio, step, active = finish_rows(sum(s[0] for s in sums), sum(s[1] for s in sums))
    for tile in tiles:
      update(*tile, ratio, step, active)
    return

  n_loop = _cdiv(n_units, loop_units)

  def accumulate(j, totals):
    _, _, _, codes, grads = load(j * loop_units, loop_units)
    tile_sq, tile_gt = _tile_stats(codes, grads, C)
    return totals[0] + tile_sq, totals[1] + tile_gt

  zeros = jnp.zeros((block_rows,), _F32)
  ratio, step, active = finish_rows(*jax.lax.fori_loop(0, n_loop, accumulate, (zeros, zeros)))

  def apply(j, carry):
    update(loop_units, *load(j * loop_units, loop_units), ratio, step, active)
    return carry

  jax.lax.fori_loop(0, n_loop, apply, ())


def counter_update(packed, scale, v, grad_w, hyper, seed, *, C, lagged, config=None,
                   interpret=False):
  """Main's ``pallas_triton_update.counter_update`` (same arguments and results)."""
  out_features, in_features = grad_w.shape
  if check_config(config, CounterUpdateConfig) is None:
    config = CounterUpdateConfig.get_heuristics_config(grad_w.shape, grad_w.dtype)
  layout = unit_layout(in_features, config.uses_words(in_features))
  per_unit = layout.codes
  group_scale = per_unit // 4
  n_units = in_features // per_unit
  chunks = config.row_chunks(in_features // 4)
  if chunks is None:
    loop_units, unit_chunks = max(1, config.block_groups // group_scale), None
  else:
    loop_units = None
    unit_chunks = tuple((start // group_scale, max(1, size // group_scale))
                        for start, size in chunks)
  vector = 1
  if config.vector_loads:
    vector = min(per_unit, max(1, 16 // jnp.dtype(grad_w.dtype).itemsize))
  kernel = functools.partial(
      _counter_update_kernel, C=C, lagged=lagged, layout=layout, n_rows=out_features,
      n_units=n_units, block_rows=config.block_rows, chunks=unit_chunks, loop_units=loop_units,
      vector=vector, high_word=needs_high_word(out_features, in_features))
  units = packed_units(packed, layout)
  out_shape = (
      jax.ShapeDtypeStruct(units.shape, units.dtype),
      jax.ShapeDtypeStruct((out_features,), _F32),
      jax.ShapeDtypeStruct((out_features,), _F32),
      jax.ShapeDtypeStruct((out_features,), _I32),
  )
  new_units, new_scale, new_v, skipped = _call(
      kernel, name="ternary_counter_update", grid=(_cdiv(out_features, config.block_rows),),
      out_shape=out_shape, config=config, interpret=interpret,
      input_output_aliases={3: 0, 4: 1, 5: 2},
  )(hyper, seed, dense_units(grad_w, per_unit), units, scale, v)
  return (packed_bytes(new_units, layout), new_scale, new_v, skipped.astype(jnp.bool_))
