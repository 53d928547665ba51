"""Pallas (Triton backend) kernels of the ternary counter ops.

Layout inside the kernels
-------------------------
A packed ``(out, 3 * in // 4)`` uint8 matrix is viewed as ``(out, G, 3)``
(``G = in // 4`` groups) and a dense ``(rows, in)`` matrix as
``(rows, G, 4)``; both reshapes are free. A kernel tile is ``(block_rows,
block_groups)`` groups and every lane (byte ``0..2`` of a group, or column
``4g + k`` of a dense row) is its own strided load ``ref.at[rows, groups, k]``,
so all register tensors are 2-D with power-of-2 sides (a Triton requirement)
and ragged edges are masked. The three byte loads of a group and the four
lane loads of a dense row touch the same cache lines, so DRAM traffic is
what the bytes say: 0.75 byte per code each way.

All formulas come from :mod:`jaxnoise.ops.ternary.reference` (the same
Python functions run on the kernels' tiles), so a kernel differs from the
reference only in the order of its row reductions.

Kernels
-------
* pack / unpack / decode / init: row-block programs, chunks of groups.
* counter update: one program per ``block_rows`` rows; a row that fits one
  chunk stays in registers, so the gradient is read once and the packed codes
  are read and written once, in place (``input_output_aliases``).
* update from IO: ``grad_out^T x`` is formed tile by tile with ``dot_general``
  (float32 accumulation) and never written out. When a tile spans whole rows
  (short rows), one kernel forms the tile, reduces the row statistics and
  updates it. Otherwise a statistics kernel writes per-tile partial sums
  (``out x in / (4 * block_groups)`` floats), the per-row scalars are formed
  in XLA, and an update kernel recomputes each tile and updates its codes: two
  GEMM-equivalents of work, no dense gradient.
* matmul: ``x @ (scale * t)^T`` reading the packed codes (0.75 byte per
  weight) and decoding them in registers, and the input gradient
  ``(grad_y * scale) @ t``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxnoise.ops import _pallas
from benchmarks.baseline_ternary import reference as ref_lib
from benchmarks.baseline_ternary.config import (
    CounterUpdateConfig,
    ElementwiseConfig,
    FromIOConfig,
    MatmulConfig,
    check_config,
)

_F32 = jnp.float32
_I32 = jnp.int32
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
  """``n_lanes`` strided ``(block_rows, block_groups)`` loads from a ``(rows, G, lanes)`` ref."""
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


def _packed_view(packed):
  out_features, n_bytes = packed.shape
  return packed.reshape(out_features, n_bytes // 3, 3)


def _dense_view(array):
  rows, in_features = array.shape
  return array.reshape(rows, in_features // 4, 4)


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


def _decode_kernel(packed_ref, scale_ref, weight_ref, *, C, n_rows, n_groups, block_rows,
                   block_groups):
  r0 = pl.program_id(0) * block_rows
  row_mask = (r0 + _iota(block_rows)) < n_rows
  scale = _load_vector(scale_ref, r0, block_rows, row_mask, 0.0).astype(_F32)[:, None]

  def chunk(j, carry):
    g0 = j * block_groups
    mask, _ = _tile_mask(row_mask, g0, block_groups, n_groups)
    codes = _load_codes(packed_ref, r0, block_rows, g0, block_groups, mask)
    weights = [(ref_lib.ternary_of(c, C).astype(_F32) * scale).astype(weight_ref.dtype)
               for c in codes]
    _store_lanes(weight_ref, r0, block_rows, g0, block_groups, weights, mask)
    return carry

  _loop(_cdiv(n_groups, block_groups), chunk, ())


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
  """Kernel of :func:`jaxnoise.ops.ternary.ternary_decode`: ``(out, in)`` weights."""
  out_features, n_bytes = packed.shape
  shape = (out_features, 4 * (n_bytes // 3))
  config = _elementwise_config(config, shape, dtype)
  kernel = functools.partial(_decode_kernel, C=C, **_elementwise_static(shape, config))
  weight = _call(
      kernel, name="ternary_decode", grid=(_cdiv(out_features, config.block_rows),),
      out_shape=jax.ShapeDtypeStruct((out_features, shape[1] // 4, 4), dtype),
      config=config, interpret=interpret,
  )(_packed_view(packed), scale)
  return weight.reshape(shape)


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


# ----------------------------------------------------------------------------
# Counter update on a dense gradient.


def _read_hyper(hyper_ref):
  return tuple(hyper_ref[k] for k in range(4))


def _update_tile(packed_out_ref, seed, r0, g0, block_rows, block_groups, mask, rows, groups,
                 codes, grads, ratio_m1, step, active, *, C, in_features, high_word,
                 bitwise=False):
  """Stochastically rounded step of a tile's four lanes, packed and stored."""
  rows_u = rows.astype(jnp.uint32)[:, None]
  new_codes = []
  for k, (code, grad) in enumerate(zip(codes, grads)):
    cols = (groups * 4 + k).astype(jnp.uint32)[None, :]
    u = ref_lib.rounding_draw(seed, rows_u, cols, in_features, high_word)
    new_codes.append(ref_lib.tick(code, grad, u, ratio_m1, step, active, C, bitwise=bitwise))
  _store_codes(packed_out_ref, r0, block_rows, g0, block_groups, new_codes, mask)


def _tile_stats(codes, grads, C, bitwise=False):
  """Row sums ``sum(g**2)`` and ``sum(g * t)`` of a tile (masked entries are 0)."""
  sum_sq = sum(jnp.sum(g * g, axis=1) for g in grads)
  if bitwise:
    ternary = [ref_lib.ternary_float(c, C) for c in codes]
  else:
    ternary = [ref_lib.ternary_of(c, C).astype(_F32) for c in codes]
  sum_gt = sum(jnp.sum(g * t, axis=1) for t, g in zip(ternary, grads))
  return sum_sq, sum_gt


def _load_dense_lanes(ref, row_start, block_rows, group_start, block_groups, mask):
  """The four lanes of a ``(rows, G, 4)`` ref from one contiguous ``(rows, groups, 4)`` load.

  The lanes are split in registers (``(.., 2, 2)`` reshape and two unstacks,
  Triton's ``split``): lane ``2a + b`` is ``[..., a, b]``.
  """
  tile = plgpu.load(ref.at[pl.ds(row_start, block_rows), pl.ds(group_start, block_groups),
                           pl.ds(0, 4)], mask=mask[:, :, None], other=0)
  tile = tile.reshape(block_rows, block_groups, 2, 2)
  low, high = jnp.unstack(tile, axis=-1)
  lane0, lane2 = jnp.unstack(low, axis=-1)
  lane1, lane3 = jnp.unstack(high, axis=-1)
  return [lane0, lane1, lane2, lane3]


def _counter_update_kernel(hyper_ref, seed_ref, grad_ref, packed_ref, scale_ref, v_ref,
                           packed_out_ref, scale_out_ref, v_out_ref, skipped_ref, *, C, lagged,
                           n_rows, n_groups, block_rows, block_groups, high_word, bitwise,
                           dense_grad):
  r0 = pl.program_id(0) * block_rows
  rows = r0 + _iota(block_rows)
  row_mask = rows < n_rows
  hyper = _read_hyper(hyper_ref)
  seed = seed_ref[0]
  scale = _load_vector(scale_ref, r0, block_rows, row_mask, 1.0)
  v = _load_vector(v_ref, r0, block_rows, row_mask, 0.0)
  n_chunks = _cdiv(n_groups, block_groups)
  in_features = 4 * n_groups

  def load(j):
    g0 = j * block_groups
    mask, groups = _tile_mask(row_mask, g0, block_groups, n_groups)
    codes = _load_codes(packed_ref, r0, block_rows, g0, block_groups, mask)
    if dense_grad:
      lanes = _load_dense_lanes(grad_ref, r0, block_rows, g0, block_groups, mask)
    else:
      lanes = _load_lanes(grad_ref, r0, block_rows, g0, block_groups, 4, mask, 0)
    return g0, mask, groups, codes, [g.astype(_F32) for g in lanes]

  def finish_rows(sum_sq, sum_gt):
    scale_new, v_new, ratio_m1, step, active = ref_lib.row_update(
        sum_sq, sum_gt, scale, v, hyper, in_features=in_features, C=C, lagged=lagged)
    _store_vector(scale_out_ref, r0, block_rows, scale_new, row_mask)
    _store_vector(v_out_ref, r0, block_rows, v_new, row_mask)
    _store_vector(skipped_ref, r0, block_rows, (~active).astype(_I32), row_mask)
    return ratio_m1[:, None], step[:, None], active[:, None]

  update = functools.partial(_update_tile, packed_out_ref, seed, r0, block_rows=block_rows,
                             block_groups=block_groups, rows=rows, C=C,
                             in_features=in_features, high_word=high_word, bitwise=bitwise)

  if n_chunks == 1:
    # The whole row is in registers: one read of the gradient and the codes.
    g0, mask, groups, codes, grads = load(0)
    ratio_m1, step, active = finish_rows(*_tile_stats(codes, grads, C, bitwise))
    update(g0=g0, mask=mask, groups=groups, codes=codes, grads=grads, ratio_m1=ratio_m1,
           step=step, active=active)
    return

  def accumulate(j, sums):
    _, _, _, codes, grads = load(j)
    tile_sq, tile_gt = _tile_stats(codes, grads, C, bitwise)
    return sums[0] + tile_sq, sums[1] + tile_gt

  zeros = jnp.zeros((block_rows,), _F32)
  sum_sq, sum_gt = jax.lax.fori_loop(0, n_chunks, accumulate, (zeros, zeros))
  ratio_m1, step, active = finish_rows(sum_sq, sum_gt)

  def apply(j, carry):
    g0, mask, groups, codes, grads = load(j)
    update(g0=g0, mask=mask, groups=groups, codes=codes, grads=grads, ratio_m1=ratio_m1,
           step=step, active=active)
    return carry

  jax.lax.fori_loop(0, n_chunks, apply, ())


def counter_update(packed, scale, v, grad_w, hyper, seed, *, C: int, lagged: bool,
                   config: CounterUpdateConfig | None = None, interpret: bool = False):
  """Kernel of :func:`jaxnoise.ops.ternary.counter_update`.

  Args:
    packed: ``(out, 3 * in // 4)`` uint8, updated in place (aliased).
    scale: ``(out,)`` float32, updated in place.
    v: ``(out,)`` float32, updated in place.
    grad_w: ``(out, in)`` float gradient.
    hyper: ``(4,)`` float32 ``[lr, lr_scale, rms_beta, rms_eps]``.
    seed: ``(1,)`` uint32.
    C: counter half-width.
    lagged: denominator from the previous ``v``.
    config: tiling (None: heuristic).
    interpret: run through the Pallas interpreter.

  Returns:
    ``(packed, scale, v, skipped)`` with ``skipped`` an ``(out,)`` bool.
  """
  out_features, in_features = grad_w.shape
  if check_config(config, CounterUpdateConfig) is None:
    config = CounterUpdateConfig.get_heuristics_config(grad_w.shape, grad_w.dtype)
  kernel = functools.partial(
      _counter_update_kernel, C=C, lagged=lagged, n_rows=out_features,
      n_groups=in_features // 4, block_rows=config.block_rows,
      block_groups=config.block_groups,
      high_word=ref_lib.needs_high_word(out_features, in_features), bitwise=config.bitwise,
      dense_grad=config.dense_grad)
  out_shape = (
      jax.ShapeDtypeStruct((out_features, in_features // 4, 3), jnp.uint8),
      jax.ShapeDtypeStruct((out_features,), _F32),
      jax.ShapeDtypeStruct((out_features,), _F32),
      jax.ShapeDtypeStruct((out_features,), _I32),
  )
  new_packed, new_scale, new_v, skipped = _call(
      kernel, name="ternary_counter_update", grid=(_cdiv(out_features, config.block_rows),),
      out_shape=out_shape, config=config, interpret=interpret,
      input_output_aliases={3: 0, 4: 1, 5: 2},
  )(hyper, seed, _dense_view(grad_w), _packed_view(packed), scale, v)
  return (new_packed.reshape(packed.shape), new_scale, new_v, skipped.astype(jnp.bool_))


# ----------------------------------------------------------------------------
# Counter update from the layer's input and output gradient.


def _io_gradient_tile(x_ref, grad_out_ref, r0, g0, row_mask, group_mask, *, m_rows, block_rows,
                      block_groups, block_m, compute_dtype, precision):
  """The four lanes of ``grad_out^T x`` on a ``(block_rows, block_groups)`` tile (float32)."""

  def step(i, accumulators):
    m0 = i * block_m
    m_mask = (m0 + _iota(block_m)) < m_rows
    grad_out = plgpu.load(grad_out_ref.at[pl.ds(m0, block_m), pl.ds(r0, block_rows)],
                          mask=m_mask[:, None] & row_mask[None, :], other=0)
    grad_out = grad_out.astype(compute_dtype)
    lanes = _load_lanes(x_ref, m0, block_m, g0, block_groups, 4,
                        m_mask[:, None] & group_mask[None, :], 0)
    return tuple(
        acc + jax.lax.dot_general(grad_out, x.astype(compute_dtype), _DIMS_TN,
                                  precision=precision, preferred_element_type=_F32)
        for acc, x in zip(accumulators, lanes))

  zeros = jnp.zeros((block_rows, block_groups), _F32)
  return _loop(_cdiv(m_rows, block_m), step, (zeros,) * 4)


def _io_fused_kernel(hyper_ref, seed_ref, x_ref, grad_out_ref, packed_ref, scale_ref, v_ref,
                     packed_out_ref, scale_out_ref, v_out_ref, skipped_ref, *, C, lagged, n_rows,
                     n_groups, m_rows, block_rows, block_groups, block_m, compute_dtype,
                     precision, high_word):
  r0 = pl.program_id(0) * block_rows
  rows = r0 + _iota(block_rows)
  row_mask = rows < n_rows
  mask, groups = _tile_mask(row_mask, 0, block_groups, n_groups)
  grads = _io_gradient_tile(
      x_ref, grad_out_ref, r0, 0, row_mask, groups < n_groups, m_rows=m_rows,
      block_rows=block_rows, block_groups=block_groups, block_m=block_m,
      compute_dtype=compute_dtype, precision=precision)
  codes = _load_codes(packed_ref, r0, block_rows, 0, block_groups, mask)
  sum_sq, sum_gt = _tile_stats(codes, grads, C)
  scale = _load_vector(scale_ref, r0, block_rows, row_mask, 1.0)
  v = _load_vector(v_ref, r0, block_rows, row_mask, 0.0)
  scale_new, v_new, ratio_m1, step, active = ref_lib.row_update(
      sum_sq, sum_gt, scale, v, _read_hyper(hyper_ref), in_features=4 * n_groups, C=C,
      lagged=lagged)
  _store_vector(scale_out_ref, r0, block_rows, scale_new, row_mask)
  _store_vector(v_out_ref, r0, block_rows, v_new, row_mask)
  _store_vector(skipped_ref, r0, block_rows, (~active).astype(_I32), row_mask)
  _update_tile(packed_out_ref, seed_ref[0], r0, 0, block_rows, block_groups, mask, rows, groups,
               codes, grads, ratio_m1[:, None], step[:, None], active[:, None], C=C,
               in_features=4 * n_groups, high_word=high_word)


def _io_stats_kernel(x_ref, grad_out_ref, packed_ref, sum_sq_ref, sum_gt_ref, *, C, n_rows,
                     n_groups, m_rows, block_rows, block_groups, block_m, compute_dtype,
                     precision):
  r0 = pl.program_id(0) * block_rows
  tile = pl.program_id(1)
  g0 = tile * block_groups
  row_mask = (r0 + _iota(block_rows)) < n_rows
  mask, groups = _tile_mask(row_mask, g0, block_groups, n_groups)
  grads = _io_gradient_tile(
      x_ref, grad_out_ref, r0, g0, row_mask, groups < n_groups, m_rows=m_rows,
      block_rows=block_rows, block_groups=block_groups, block_m=block_m,
      compute_dtype=compute_dtype, precision=precision)
  codes = _load_codes(packed_ref, r0, block_rows, g0, block_groups, mask)
  sum_sq, sum_gt = _tile_stats(codes, grads, C)
  plgpu.store(sum_sq_ref.at[pl.ds(r0, block_rows), tile], sum_sq, mask=row_mask)
  plgpu.store(sum_gt_ref.at[pl.ds(r0, block_rows), tile], sum_gt, mask=row_mask)


def _io_apply_kernel(seed_ref, x_ref, grad_out_ref, ratio_ref, step_ref, active_ref, packed_ref,
                     packed_out_ref, *, C, n_rows, n_groups, m_rows, block_rows, block_groups,
                     block_m, compute_dtype, precision, high_word):
  r0 = pl.program_id(0) * block_rows
  g0 = pl.program_id(1) * block_groups
  rows = r0 + _iota(block_rows)
  row_mask = rows < n_rows
  mask, groups = _tile_mask(row_mask, g0, block_groups, n_groups)
  grads = _io_gradient_tile(
      x_ref, grad_out_ref, r0, g0, row_mask, groups < n_groups, m_rows=m_rows,
      block_rows=block_rows, block_groups=block_groups, block_m=block_m,
      compute_dtype=compute_dtype, precision=precision)
  codes = _load_codes(packed_ref, r0, block_rows, g0, block_groups, mask)
  ratio_m1 = _load_vector(ratio_ref, r0, block_rows, row_mask, 0.0)[:, None]
  step = _load_vector(step_ref, r0, block_rows, row_mask, 0.0)[:, None]
  active = (_load_vector(active_ref, r0, block_rows, row_mask, 0) != 0)[:, None]
  _update_tile(packed_out_ref, seed_ref[0], r0, g0, block_rows, block_groups, mask, rows, groups,
               codes, grads, ratio_m1, step, active, C=C, in_features=4 * n_groups,
               high_word=high_word)


def _dot_setup(dtype_a, dtype_b, allow_tf32: bool):
  compute_dtype = jnp.promote_types(dtype_a, dtype_b)
  if compute_dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    compute_dtype = jnp.dtype(_F32)
  precision = jax.lax.Precision.DEFAULT if allow_tf32 else _HIGHEST
  return compute_dtype, precision


def counter_update_from_io(packed, scale, v, x, grad_out, hyper, seed, *, C: int, lagged: bool,
                           config: FromIOConfig | None = None, interpret: bool = False):
  """Kernel(s) of :func:`jaxnoise.ops.ternary.counter_update_from_io`.

  Args:
    packed: ``(out, 3 * in // 4)`` uint8, updated in place.
    scale: ``(out,)`` float32.
    v: ``(out,)`` float32.
    x: ``(M, in)`` layer input.
    grad_out: ``(M, out)`` gradient of the layer output.
    hyper: ``(4,)`` float32 ``[lr, lr_scale, rms_beta, rms_eps]``.
    seed: ``(1,)`` uint32.
    C: counter half-width.
    lagged: denominator from the previous ``v``.
    config: tiling (None: heuristic).
    interpret: run through the Pallas interpreter.

  Returns:
    ``(packed, scale, v, skipped)`` with ``skipped`` an ``(out,)`` bool.
  """
  m_rows, in_features = x.shape
  out_features = grad_out.shape[1]
  n_groups = in_features // 4
  if check_config(config, FromIOConfig) is None:
    config = FromIOConfig.get_heuristics_config(
        (m_rows, out_features, in_features), jnp.promote_types(x.dtype, grad_out.dtype))
  compute_dtype, precision = _dot_setup(x.dtype, grad_out.dtype, config.allow_tf32)
  high_word = ref_lib.needs_high_word(out_features, in_features)
  common = dict(C=C, n_rows=out_features, n_groups=n_groups, m_rows=m_rows,
                block_rows=config.block_rows, block_groups=config.block_groups,
                block_m=config.block_m, compute_dtype=compute_dtype, precision=precision)
  n_row_blocks = _cdiv(out_features, config.block_rows)
  packed3 = _packed_view(packed)
  x3 = _dense_view(x)

  if config.fused(in_features):
    kernel = functools.partial(_io_fused_kernel, lagged=lagged, high_word=high_word, **common)
    out_shape = (
        jax.ShapeDtypeStruct(packed3.shape, jnp.uint8),
        jax.ShapeDtypeStruct((out_features,), _F32),
        jax.ShapeDtypeStruct((out_features,), _F32),
        jax.ShapeDtypeStruct((out_features,), _I32),
    )
    new_packed, new_scale, new_v, skipped = _call(
        kernel, name="ternary_counter_update_from_io", grid=(n_row_blocks,),
        out_shape=out_shape, config=config, interpret=interpret,
        input_output_aliases={4: 0, 5: 1, 6: 2},
    )(hyper, seed, x3, grad_out, packed3, scale, v)
    return new_packed.reshape(packed.shape), new_scale, new_v, skipped.astype(jnp.bool_)

  n_tiles = _cdiv(n_groups, config.block_groups)
  grid = (n_row_blocks, n_tiles)
  partial_shape = jax.ShapeDtypeStruct((out_features, n_tiles), _F32)
  sum_sq, sum_gt = _call(
      functools.partial(_io_stats_kernel, **common), name="ternary_from_io_stats", grid=grid,
      out_shape=(partial_shape, partial_shape), config=config, interpret=interpret,
  )(x3, grad_out, packed3)
  new_scale, new_v, ratio_m1, step, active = ref_lib.row_update(
      sum_sq.sum(axis=1), sum_gt.sum(axis=1), scale, v, hyper, in_features=in_features, C=C,
      lagged=lagged)
  new_packed = _call(
      functools.partial(_io_apply_kernel, high_word=high_word, **common),
      name="ternary_from_io_update", grid=grid,
      out_shape=jax.ShapeDtypeStruct(packed3.shape, jnp.uint8), config=config,
      interpret=interpret, input_output_aliases={6: 0},
  )(seed, x3, grad_out, ratio_m1, step, active.astype(_I32), packed3)
  return new_packed.reshape(packed.shape), new_scale, new_v, ~active


# ----------------------------------------------------------------------------
# Packed ternary matmul and its input gradient.


def _matmul_kernel(x_ref, packed_ref, scale_ref, y_ref, *, C, m_rows, n_out, n_groups, block_m,
                   block_n, block_groups, compute_dtype, precision):
  m0 = pl.program_id(0) * block_m
  n0 = pl.program_id(1) * block_n
  m_mask = (m0 + _iota(block_m)) < m_rows
  n_mask = (n0 + _iota(block_n)) < n_out

  def step(i, acc):
    g0 = i * block_groups
    group_mask = (g0 + _iota(block_groups)) < n_groups
    codes = _load_codes(packed_ref, n0, block_n, g0, block_groups,
                        n_mask[:, None] & group_mask[None, :])
    lanes = _load_lanes(x_ref, m0, block_m, g0, block_groups, 4,
                        m_mask[:, None] & group_mask[None, :], 0)
    for code, x in zip(codes, lanes):
      # int -> float32 -> compute dtype: exact, and avoids int -> bf16 conversions.
      t = ref_lib.ternary_of(code, C).astype(_F32).astype(compute_dtype)
      acc = acc + jax.lax.dot_general(x.astype(compute_dtype), t, _DIMS_NT,
                                      precision=precision, preferred_element_type=_F32)
    return acc

  acc = _loop(_cdiv(n_groups, block_groups), step, jnp.zeros((block_m, block_n), _F32))
  scale = _load_vector(scale_ref, n0, block_n, n_mask, 0.0).astype(_F32)
  plgpu.store(y_ref.at[pl.ds(m0, block_m), pl.ds(n0, block_n)],
              (acc * scale[None, :]).astype(y_ref.dtype),
              mask=m_mask[:, None] & n_mask[None, :])


def _matmul_input_grad_kernel(grad_y_ref, packed_ref, scale_ref, grad_x_ref, *, C, m_rows, n_out,
                              n_groups, block_m, block_n, block_groups, compute_dtype,
                              precision):
  m0 = pl.program_id(0) * block_m
  g0 = pl.program_id(1) * block_groups
  m_mask = (m0 + _iota(block_m)) < m_rows
  group_mask = (g0 + _iota(block_groups)) < n_groups

  def step(i, accumulators):
    n0 = i * block_n
    n_mask = (n0 + _iota(block_n)) < n_out
    grad_y = plgpu.load(grad_y_ref.at[pl.ds(m0, block_m), pl.ds(n0, block_n)],
                        mask=m_mask[:, None] & n_mask[None, :], other=0)
    scale = _load_vector(scale_ref, n0, block_n, n_mask, 0.0).astype(_F32)
    scaled = (grad_y.astype(_F32) * scale[None, :]).astype(compute_dtype)
    codes = _load_codes(packed_ref, n0, block_n, g0, block_groups,
                        n_mask[:, None] & group_mask[None, :])
    return tuple(
        acc + jax.lax.dot_general(
            scaled, ref_lib.ternary_of(code, C).astype(_F32).astype(compute_dtype), _DIMS_NN,
            precision=precision, preferred_element_type=_F32)
        for acc, code in zip(accumulators, codes))

  zeros = jnp.zeros((block_m, block_groups), _F32)
  accumulators = _loop(_cdiv(n_out, block_n), step, (zeros,) * 4)
  _store_lanes(grad_x_ref, m0, block_m, g0, block_groups,
               [acc.astype(grad_x_ref.dtype) for acc in accumulators],
               m_mask[:, None] & group_mask[None, :])


def _matmul_config(config, shape, dtype) -> MatmulConfig:
  if check_config(config, MatmulConfig) is None:
    return MatmulConfig.get_heuristics_config(shape, dtype)
  return config


def ternary_matmul(x, packed, scale, *, C: int, out_dtype, config: MatmulConfig | None = None,
                   interpret: bool = False):
  """``(M, in) @ (scale * t)^T -> (M, out)`` reading the packed codes in the kernel."""
  m_rows, in_features = x.shape
  out_features = packed.shape[0]
  config = _matmul_config(config, (m_rows, out_features, in_features), x.dtype)
  compute_dtype, precision = _dot_setup(x.dtype, x.dtype, config.allow_tf32)
  kernel = functools.partial(
      _matmul_kernel, C=C, m_rows=m_rows, n_out=out_features, n_groups=in_features // 4,
      block_m=config.block_m, block_n=config.block_n, block_groups=config.block_groups,
      compute_dtype=compute_dtype, precision=precision)
  return _call(
      kernel, name="ternary_matmul",
      grid=(_cdiv(m_rows, config.block_m), _cdiv(out_features, config.block_n)),
      out_shape=jax.ShapeDtypeStruct((m_rows, out_features), out_dtype), config=config,
      interpret=interpret,
  )(_dense_view(x), _packed_view(packed), scale)


def ternary_matmul_input_grad(grad_y, packed, scale, *, C: int, out_dtype,
                              config: MatmulConfig | None = None, interpret: bool = False):
  """``(grad_y * scale) @ t``: ``(M, out) -> (M, in)``, reading the packed codes."""
  m_rows, out_features = grad_y.shape
  in_features = 4 * (packed.shape[1] // 3)
  config = _matmul_config(config, (m_rows, in_features, out_features), grad_y.dtype)
  compute_dtype, precision = _dot_setup(grad_y.dtype, grad_y.dtype, config.allow_tf32)
  n_groups = in_features // 4
  kernel = functools.partial(
      _matmul_input_grad_kernel, C=C, m_rows=m_rows, n_out=out_features, n_groups=n_groups,
      block_m=config.block_m, block_n=config.block_n, block_groups=config.block_groups,
      compute_dtype=compute_dtype, precision=precision)
  grad_x = _call(
      kernel, name="ternary_matmul_input_grad",
      grid=(_cdiv(m_rows, config.block_m), _cdiv(n_groups, config.block_groups)),
      out_shape=jax.ShapeDtypeStruct((m_rows, n_groups, 4), out_dtype), config=config,
      interpret=interpret,
  )(grad_y, _packed_view(packed), scale)
  return grad_x.reshape(m_rows, in_features)


__all__ = [
    "counter_update",
    "counter_update_from_io",
    "pack_codes",
    "ternary_decode",
    "ternary_init",
    "ternary_matmul",
    "ternary_matmul_input_grad",
    "unpack_codes",
]
