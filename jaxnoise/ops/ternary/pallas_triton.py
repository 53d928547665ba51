"""Pallas (Triton backend) kernels of the ternary ops: shared tile helpers, pack/unpack/decode/init.

Layout inside the kernels
-------------------------
A packed ``(out, 3 * in // 4)`` uint8 matrix is a little-endian stream of
6-bit codes per row. Kernels read it in *units* (:class:`UnitLayout`):

* ``words`` (``in % 16 == 0``): the row is ``in / 16`` units of three uint32
  words holding 16 codes (a free bitcast of the bytes,
  :func:`packed_units`); three loads and stores per 16 codes.
* ``bytes`` (any ``in % 4 == 0``): ``in / 4`` groups of three bytes holding
  4 codes.

A tile is ``(block_rows, units)``; each of the three lanes (word or byte ``k``
of a unit) is its own strided load ``ref.at[rows, units, k]``, so register
tensors are 2-D with power-of-2 sides (a Triton requirement) and ragged edges
are masked. The lanes of a unit touch the same cache lines, so DRAM traffic is
0.75 byte per code each way. Unpacked, a unit is ``L`` code lanes (4 or 16);
:func:`interleave` joins lanes into natural column order (``tt.join``, no data
movement) and :func:`split_lanes` splits a contiguous dense tile into lanes.

All formulas come from :mod:`jaxnoise.ops.ternary.reference` (the same
Python functions run on the kernels' tiles), so a kernel differs from the
reference only in the order of its row reductions.

Kernels: pack / unpack / decode / init here (row-block programs, chunks of
groups); the counter updates in :mod:`.pallas_triton_update`; the packed
matmul in :mod:`.pallas_triton_matmul`.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxnoise.ops import _pallas
from jaxnoise.ops.ternary import reference as ref_lib
from jaxnoise.ops.ternary.config import ElementwiseConfig, check_config

_F32 = jnp.float32
_I32 = jnp.int32
_U32 = jnp.uint32
_HIGHEST = jax.lax.Precision.HIGHEST
# Contract dim 0 of both operands: grad_out^T (BM, BR) x (BM, BG) -> (BR, BG).
_DIMS_TN = (((0,), (0,)), ((), ()))
# x (BM, BG) . t (BN, BG)^T -> (BM, BN).
_DIMS_NT = (((1,), (1,)), ((), ()))
# g (BM, BN) . t (BN, BG) -> (BM, BG).
_DIMS_NN = (((1,), (0,)), ((), ()))


def _cdiv(a: int, b: int) -> int:
  return -(-a // b)


def _iota(n: int):
  return jax.lax.broadcasted_iota(_I32, (n,), 0)


def _call(kernel, *, name: str, grid, out_shape, config, interpret: bool,
          input_output_aliases=None):
  """:func:`jaxnoise.ops._pallas.pallas_call` with the config's Triton compiler params."""
  return _pallas.pallas_call(
      kernel,
      out_shape=out_shape,
      grid=grid,
      input_output_aliases=input_output_aliases or {},
      compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
      interpret=interpret,
      name=name,
  )


def _loop(n_steps: int, body, init):
  """``fori_loop`` over ``n_steps``, or a plain call with a static index when 1."""
  if n_steps == 1:
    return body(0, init)
  return jax.lax.fori_loop(0, n_steps, body, init)


def _tile_mask(row_mask, group_start, block_groups: int, n_groups: int):
  groups = group_start + _iota(block_groups)
  return row_mask[:, None] & (groups < n_groups)[None, :], groups


def _load_lanes(ref, row_start, block_rows: int, group_start, block_groups: int, n_lanes: int,
                mask, other):
  """``n_lanes`` strided ``(block_rows, block_groups)`` loads from a ``(rows, G, lanes)`` ref.

  ``mask=None`` loads every element (``other`` is then unused: jax >= 0.11
  rejects an ``other`` without a mask).
  """
  other = None if mask is None else other
  return [
      plgpu.load(ref.at[pl.ds(row_start, block_rows), pl.ds(group_start, block_groups), _I32(k)],
                 mask=mask, other=other)
      for k in range(n_lanes)
  ]


def _store_lanes(ref, row_start, block_rows: int, group_start, block_groups: int, values, mask):
  for k, value in enumerate(values):
    plgpu.store(ref.at[pl.ds(row_start, block_rows), pl.ds(group_start, block_groups), _I32(k)],
                value, mask=mask)


def _load_codes(packed_ref, row_start, block_rows, group_start, block_groups, mask):
  """The four int32 code lanes of a tile of a ``(out, G, 3)`` packed ref."""
  raw = _load_lanes(packed_ref, row_start, block_rows, group_start, block_groups, 3, mask, 0)
  return ref_lib.unpack_group(*(b.astype(_I32) for b in raw))


def _store_codes(packed_ref, row_start, block_rows, group_start, block_groups, codes, mask):
  packed = ref_lib.pack_group(*codes)
  _store_lanes(packed_ref, row_start, block_rows, group_start, block_groups,
               [b.astype(jnp.uint8) for b in packed], mask)


def _load_vector(ref, start, size: int, mask, other):
  return plgpu.load(ref.at[pl.ds(start, size)], mask=mask, other=other)


def _store_vector(ref, start, size: int, value, mask):
  plgpu.store(ref.at[pl.ds(start, size)], value, mask=mask)


def _dot_setup(dtype_a, dtype_b, allow_tf32: bool):
  compute_dtype = jnp.promote_types(dtype_a, dtype_b)
  if compute_dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    compute_dtype = jnp.dtype(_F32)
  precision = jax.lax.Precision.DEFAULT if allow_tf32 else _HIGHEST
  return compute_dtype, precision


def _packed_view(packed):
  out_features, n_bytes = packed.shape
  return packed.reshape(out_features, n_bytes // 3, 3)


def _dense_view(array):
  rows, in_features = array.shape
  return array.reshape(rows, in_features // 4, 4)


# ----------------------------------------------------------------------------
# Unit layouts of packed rows.


@dataclasses.dataclass(frozen=True)
class UnitLayout:
  """How a kernel reads a packed row (see the module docstring).

  Attributes:
    words: three uint32 words per 16 codes (else three bytes per 4 codes).
  """

  words: bool

  @property
  def codes(self) -> int:
    """Codes per unit (``L``)."""
    return ref_lib.CODES_PER_WORD_GROUP if self.words else 4

  @property
  def dtype(self):
    return jnp.uint32 if self.words else jnp.uint8


def unit_layout(in_features: int, words: bool = True) -> UnitLayout:
  """Words when asked for and every row starts on a word (``in % 16 == 0``), else bytes."""
  return UnitLayout(words and in_features % ref_lib.CODES_PER_WORD_GROUP == 0)


def packed_units(packed, layout: UnitLayout):
  """``(out, 3 * in // 4)`` uint8 -> ``(out, units, 3)`` lanes of ``layout`` (a free view)."""
  out_features, n_bytes = packed.shape
  if layout.words:
    return jax.lax.bitcast_convert_type(packed.reshape(out_features, n_bytes // 12, 3, 4),
                                        jnp.uint32)
  return packed.reshape(out_features, n_bytes // 3, 3)


def packed_bytes(units, layout: UnitLayout):
  """Inverse of :func:`packed_units`."""
  if layout.words:
    units = jax.lax.bitcast_convert_type(units, jnp.uint8)
  return units.reshape(units.shape[0], -1)


def load_unit_centers(packed_ref, row_start, block_rows, unit_start, block_units, mask,
                      layout: UnitLayout, C: int, bias_bits=ref_lib.FLOAT_BIAS_BITS):
  """The ``L`` code lanes of a unit tile as ``(centre * 2**shift, shift)``, read from the fields.

  See :func:`ref_lib.word_centers` and :func:`ref_lib.group_centers`
  (``bias_bits``: :func:`ref_lib.field_center`).
  """
  raw = load_unit_fields(packed_ref, row_start, block_rows, unit_start, block_units, mask)
  return unit_centers(raw, layout, C, bias_bits)


def load_unit_fields(packed_ref, row_start, block_rows, unit_start, block_units, mask):
  """The three packed lanes of a unit tile, as loaded (see :func:`unit_centers`)."""
  return _load_lanes(packed_ref, row_start, block_rows, unit_start, block_units, 3, mask, 0)


def unit_centers(raw, layout: UnitLayout, C: int, bias_bits=ref_lib.FLOAT_BIAS_BITS):
  """:func:`load_unit_centers` of lanes already loaded by :func:`load_unit_fields`."""
  if layout.words:
    return ref_lib.word_centers(*raw, C, bias_bits)
  return ref_lib.group_centers(*(b.astype(jnp.uint32) for b in raw), C, bias_bits)


def opaque_copy(value, interpret: bool):
  """``value`` (uint32 or uint8) through one ``mov``: a result the compiler cannot merge.

  Deriving something twice from the same values is merged into one result
  kept live in between; what is derived from this copy is computed again.
  The interpreter takes ``value`` itself (the same values).
  """
  if interpret:
    return value
  wide = value.astype(jnp.uint32) if value.dtype != jnp.uint32 else value
  [copy] = plgpu.elementwise_inline_asm(
      "mov.b32 $0, $1;", args=[wide], constraints="=r,r", pack=1,
      result_shape_dtypes=[jax.ShapeDtypeStruct(wide.shape, jnp.int32)])
  return copy.astype(jnp.uint32).astype(value.dtype)


def truncate_codes(value, interpret: bool):
  """uint32 truncation of float32 values already clipped to ``[0, 63]`` (the new codes).

  Compiled, one ``cvt.rzi.u32.f32``: ``astype`` lowers to the conversion
  behind a clamp to the int32 range (two more min / max per code), which the
  clipped values never need. The interpreter takes ``astype`` (the same values).
  """
  if interpret:
    return value.astype(jnp.int32).astype(jnp.uint32)
  # Declared int32: Triton's inline asm takes signless integers only (same bits).
  [codes] = plgpu.elementwise_inline_asm(
      "cvt.rzi.u32.f32 $0, $1;", args=[value], constraints="=r,r", pack=1,
      result_shape_dtypes=[jax.ShapeDtypeStruct(value.shape, jnp.int32)])
  return codes.astype(jnp.uint32)


def unit_ternary(raw, layout: UnitLayout, C: int, bases, *, compiled: bool):
  """Per code lane of a unit tile's three loaded lanes: its float32 ternary value.

  Two clamped adds per code (:func:`ref_lib.field_ternary`), compiled as one
  ``add.rn.sat.f32`` each: ``ternary_of`` of the unpacked codes exactly, with
  one integer instruction per in-place code where unpacking, compares and
  selects took five. ``bases``:
  :data:`ref_lib.RAMP_BASES` loaded from memory (:func:`ramp_bases`).
  """
  saturated = functools.partial(_pallas.saturated_add, compiled=compiled)
  if layout.words:
    return ref_lib.word_ternary(*raw, C, saturated, bases)
  return ref_lib.group_ternary(*(b.astype(_U32) for b in raw), C, saturated, bases)


def ramp_bases() -> jax.Array:
  """:data:`ref_lib.RAMP_BASES` as a uint32 array, a kernel input (see :func:`unit_ternary`)."""
  return jnp.asarray(ref_lib.RAMP_BASES, _U32)


def load_ramp_bases(bases_ref) -> list:
  """The kernel input :func:`ramp_bases` as scalars, loaded once per program."""
  return [bases_ref[k] for k in range(len(ref_lib.RAMP_BASES))]


def store_unit_codes(packed_ref, row_start, block_rows, unit_start, block_units, codes, mask,
                     layout: UnitLayout):
  """Pack ``L`` int32 code lanes (values in ``[0, 64)``) and store them."""
  if layout.words:
    raw = ref_lib.pack_words(codes)
  else:
    raw = [b.astype(jnp.uint8) for b in ref_lib.pack_group(*codes)]
  _store_lanes(packed_ref, row_start, block_rows, unit_start, block_units, raw, mask)


def interleave(lanes):
  """``L`` (power of 2) lanes ``(R, U)`` -> ``(R, U * L)`` with column ``u * L + j`` from lane ``j``.

  A tree of ``tt.join`` (``jnp.stack`` on a new last axis): the joined axis
  stays in each thread's registers, so no data moves.
  """
  rows, units = lanes[0].shape
  return _interleave3(list(lanes)).reshape(rows, units * len(lanes))


def _interleave3(lanes):
  if len(lanes) == 2:
    return jnp.stack(lanes, axis=-1)
  even, odd = _interleave3(lanes[0::2]), _interleave3(lanes[1::2])
  rows, units, half = even.shape
  return jnp.stack([even, odd], axis=-1).reshape(rows, units, 2 * half)


def split_lanes(tile):
  """``(R, U, L)`` -> ``L`` lanes ``(R, U)`` (lane ``j`` is ``tile[..., j]``), by ``tt.split``."""
  rows, units, n_lanes = tile.shape
  if n_lanes == 1:
    return [tile.reshape(rows, units)]
  even, odd = jnp.unstack(tile.reshape(rows, units, n_lanes // 2, 2), axis=-1)
  lanes = [None] * n_lanes
  lanes[0::2] = split_lanes(even)
  lanes[1::2] = split_lanes(odd)
  return lanes


def load_dense_lanes(ref, row_start, block_rows, unit_start, block_units, n_lanes: int,
                     vector: int, mask, other=0):
  """The ``n_lanes`` lanes of a ``(rows, U, n_lanes)`` dense ref, in loads of ``vector`` lanes.

  Each load is a ``(block_rows, block_units, vector)`` tile (``vector``
  contiguous elements per unit: one vector load per thread), split into lanes
  in registers. ``vector=1`` gives one strided load per lane. ``mask=None``
  loads every element.
  """
  lanes = []
  for first in range(0, n_lanes, vector):
    if vector == 1:
      lanes.append(plgpu.load(
          ref.at[pl.ds(row_start, block_rows), pl.ds(unit_start, block_units), _I32(first)],
          mask=mask, other=None if mask is None else other))
      continue
    tile = plgpu.load(ref.at[pl.ds(row_start, block_rows), pl.ds(unit_start, block_units),
                             pl.ds(first, vector)],
                      mask=None if mask is None else mask[:, :, None],
                      other=None if mask is None else other)
    lanes.extend(split_lanes(tile))
  return lanes


def widen_bfloat16_pairs(words):
  """float32 lanes of uint32 words that each hold two bfloat16 (low half first): twice as many.

  A bfloat16 is the high half of its float32, so the low value is the word
  shifted up and the high one the word masked: one op per value, the exact
  conversion.
  """
  lanes = []
  for word in words:
    lanes.append(jax.lax.bitcast_convert_type(word << 16, _F32))
    lanes.append(jax.lax.bitcast_convert_type(word & jnp.uint32(0xFFFF0000), _F32))
  return lanes


def bfloat16_pair_units(array, codes_per_unit: int):
  """``(rows, in)`` bfloat16 -> ``(rows, in / L, L / 2)`` uint32 pairs (a free bitcast)."""
  rows, in_features = array.shape
  pairs = jax.lax.bitcast_convert_type(array.reshape(rows, in_features // 2, 2), jnp.uint32)
  return pairs.reshape(rows, in_features // codes_per_unit, codes_per_unit // 2)


def dense_units(array, codes_per_unit: int):
  """``(rows, in)`` -> ``(rows, in / L, L)`` (a free reshape)."""
  rows, in_features = array.shape
  return array.reshape(rows, in_features // codes_per_unit, codes_per_unit)


# ----------------------------------------------------------------------------
# Pack / unpack / decode / init.


def _pack_kernel(codes_ref, packed_ref, *, n_rows, n_groups, block_rows, block_groups):
  r0 = pl.program_id(0) * block_rows
  row_mask = (r0 + _iota(block_rows)) < n_rows

  def chunk(j, carry):
    g0 = j * block_groups
    mask, _ = _tile_mask(row_mask, g0, block_groups, n_groups)
    codes = _load_lanes(codes_ref, r0, block_rows, g0, block_groups, 4, mask, 0)
    _store_codes(packed_ref, r0, block_rows, g0, block_groups,
                 [c.astype(_I32) & 0x3F for c in codes], mask)
    return carry

  _loop(_cdiv(n_groups, block_groups), chunk, ())


def _unpack_kernel(packed_ref, codes_ref, *, n_rows, n_groups, block_rows, block_groups):
  r0 = pl.program_id(0) * block_rows
  row_mask = (r0 + _iota(block_rows)) < n_rows

  def chunk(j, carry):
    g0 = j * block_groups
    mask, _ = _tile_mask(row_mask, g0, block_groups, n_groups)
    codes = _load_codes(packed_ref, r0, block_rows, g0, block_groups, mask)
    _store_lanes(codes_ref, r0, block_rows, g0, block_groups,
                 [c.astype(jnp.uint8) for c in codes], mask)
    return carry

  _loop(_cdiv(n_groups, block_groups), chunk, ())


def _decode_rows(packed_ref, out_ref, values_of, *, r0, row_mask, n_units, block_rows,
                 block_units, columns_per_unit: int):
  """Store ``values_of(raw)`` of a row block chunk by chunk, lanes joined in column order.

  ``values_of`` maps the three loaded word or byte lanes of a ``(block_rows,
  block_units)`` chunk to ``columns_per_unit`` lanes of output columns.
  """
  width = block_units * columns_per_unit

  def chunk(j, carry):
    u0 = j * block_units
    unit_mask = (u0 + _iota(block_units)) < n_units
    raw = _load_lanes(packed_ref, r0, block_rows, u0, block_units, 3,
                      row_mask[:, None] & unit_mask[None, :], 0)
    col_mask = (u0 * columns_per_unit + _iota(width)) < n_units * columns_per_unit
    plgpu.store(out_ref.at[pl.ds(r0, block_rows), pl.ds(u0 * columns_per_unit, width)],
                interleave(values_of(raw)), mask=row_mask[:, None] & col_mask[None, :])
    return carry

  _loop(_cdiv(n_units, block_units), chunk, ())


def _decode_kernel(packed_ref, scale_ref, bases_ref, weight_ref, *, C, layout: UnitLayout,
                   n_rows, n_units, block_rows, block_units, compiled):
  """Codes -> ``scale * t``; the lanes are joined in column order and stored contiguously.

  ``t`` from the packed fields (:func:`unit_ternary`), no integer-to-float conversion.
  """
  r0 = pl.program_id(0) * block_rows
  row_mask = (r0 + _iota(block_rows)) < n_rows
  scale = _load_vector(scale_ref, r0, block_rows, row_mask, 0.0).astype(_F32)[:, None]
  bases = load_ramp_bases(bases_ref)
  values_of = lambda raw: [(t * scale).astype(weight_ref.dtype)
                           for t in unit_ternary(raw, layout, C, bases, compiled=compiled)]
  _decode_rows(packed_ref, weight_ref, values_of, r0=r0, row_mask=row_mask, n_units=n_units,
               block_rows=block_rows, block_units=block_units, columns_per_unit=layout.codes)


def _init_kernel(weight_ref, packed_ref, scale_ref, *, C, n_rows, n_groups, block_rows,
                 block_groups):
  r0 = pl.program_id(0) * block_rows
  row_mask = (r0 + _iota(block_rows)) < n_rows
  n_chunks = _cdiv(n_groups, block_groups)

  def load(j):
    g0 = j * block_groups
    mask, _ = _tile_mask(row_mask, g0, block_groups, n_groups)
    lanes = _load_lanes(weight_ref, r0, block_rows, g0, block_groups, 4, mask, 0)
    return g0, mask, [w.astype(_F32) for w in lanes]

  def absolute_sum(j, total):
    _, _, lanes = load(j)
    return total + sum(jnp.sum(jnp.abs(w), axis=1) for w in lanes)

  total = _loop(n_chunks, absolute_sum, jnp.zeros((block_rows,), _F32))
  scale = jnp.clip(total / _F32(4 * n_groups), _F32(ref_lib.SCALE_MIN), _F32(ref_lib.SCALE_MAX))
  _store_vector(scale_ref, r0, block_rows, scale, row_mask)

  def codes_of(j, carry):
    g0, mask, lanes = load(j)
    codes = [ref_lib.code_of_latent(w / scale[:, None], C) for w in lanes]
    _store_codes(packed_ref, r0, block_rows, g0, block_groups, codes, mask)
    return carry

  _loop(n_chunks, codes_of, ())


def _elementwise_config(config, shape, dtype) -> ElementwiseConfig:
  if check_config(config, ElementwiseConfig) is None:
    return ElementwiseConfig.get_heuristics_config(shape, dtype)
  return config


def _elementwise_static(shape, config):
  out_features, in_features = shape
  return dict(n_rows=out_features, n_groups=in_features // 4, block_rows=config.block_rows,
              block_groups=config.block_groups)


def pack_codes(codes, *, config: ElementwiseConfig | None = None, interpret: bool = False):
  """Kernel of :func:`jaxnoise.ops.ternary.pack_codes`: ``(out, in)`` -> ``(out, 3in/4)`` uint8."""
  out_features, in_features = codes.shape
  config = _elementwise_config(config, codes.shape, codes.dtype)
  kernel = functools.partial(_pack_kernel, **_elementwise_static(codes.shape, config))
  packed = _call(
      kernel, name="ternary_pack_codes", grid=(_cdiv(out_features, config.block_rows),),
      out_shape=jax.ShapeDtypeStruct((out_features, in_features // 4, 3), jnp.uint8),
      config=config, interpret=interpret,
  )(_dense_view(codes))
  return packed.reshape(out_features, 3 * (in_features // 4))


def unpack_codes(packed, *, config: ElementwiseConfig | None = None, interpret: bool = False):
  """Kernel of :func:`jaxnoise.ops.ternary.unpack_codes`: ``(out, 3in/4)`` -> ``(out, in)`` uint8."""
  out_features, n_bytes = packed.shape
  shape = (out_features, 4 * (n_bytes // 3))
  config = _elementwise_config(config, shape, jnp.uint8)
  kernel = functools.partial(_unpack_kernel, **_elementwise_static(shape, config))
  codes = _call(
      kernel, name="ternary_unpack_codes", grid=(_cdiv(out_features, config.block_rows),),
      out_shape=jax.ShapeDtypeStruct((out_features, shape[1] // 4, 4), jnp.uint8),
      config=config, interpret=interpret,
  )(_packed_view(packed))
  return codes.reshape(shape)


def ternary_decode(packed, scale, *, C: int, dtype=jnp.float32,
                   config: ElementwiseConfig | None = None, interpret: bool = False):
  """Kernel of :func:`jaxnoise.ops.ternary.ternary_decode`: ``(out, in)`` weights.

  One program per ``block_rows`` rows. Reads word units where rows allow
  (``in % 16 == 0`` and ``block_groups >= 4``) and writes each row chunk
  contiguously.
  """
  out_features, n_bytes = packed.shape
  in_features = 4 * (n_bytes // 3)
  config = _elementwise_config(config, (out_features, in_features), dtype)
  layout = unit_layout(in_features, config.block_groups >= 4)
  kernel = functools.partial(
      _decode_kernel, C=C, layout=layout, n_rows=out_features,
      n_units=in_features // layout.codes, block_rows=config.block_rows,
      block_units=max(1, config.block_groups * 4 // layout.codes), compiled=not interpret)
  return _call(
      kernel, name="ternary_decode", grid=(_cdiv(out_features, config.block_rows),),
      out_shape=jax.ShapeDtypeStruct((out_features, in_features), dtype),
      config=config, interpret=interpret,
  )(packed_units(packed, layout), scale, ramp_bases())


def ternary_init(weight, *, C: int, config: ElementwiseConfig | None = None,
                 interpret: bool = False):
  """Kernel of :func:`jaxnoise.ops.ternary.ternary_init`: ``(packed, scale)``."""
  out_features, in_features = weight.shape
  config = _elementwise_config(config, weight.shape, weight.dtype)
  kernel = functools.partial(_init_kernel, C=C, **_elementwise_static(weight.shape, config))
  packed, scale = _call(
      kernel, name="ternary_init", grid=(_cdiv(out_features, config.block_rows),),
      out_shape=(jax.ShapeDtypeStruct((out_features, in_features // 4, 3), jnp.uint8),
                 jax.ShapeDtypeStruct((out_features,), _F32)),
      config=config, interpret=interpret,
  )(_dense_view(weight))
  return packed.reshape(out_features, 3 * (in_features // 4)), scale


__all__ = [
    "UnitLayout",
    "interleave",
    "load_ramp_bases",
    "pack_codes",
    "packed_bytes",
    "packed_units",
    "ramp_bases",
    "split_lanes",
    "ternary_decode",
    "ternary_init",
    "unit_layout",
    "unit_ternary",
    "unpack_codes",
]
