"""Pallas (Triton) kernels of the counter updates: on a dense gradient, and from (x, grad_out).

Counter update on a dense gradient
----------------------------------
Memory-bound: it must move the gradient once and the packed codes once each
way (``itemsize + 1.5`` bytes per weight). Every element's new code needs two
statistics of its whole row (``sum g**2`` and ``sum g * t``), so a program
owns ``block_rows`` whole rows and keeps them in registers: the row is cut
into static *chunks* (:meth:`CounterUpdateConfig.row_chunks`: power-of-2
tiles, the last one masked), all loaded before the row's statistics are
reduced, then ticked and stored. Rows longer than ``max_resident_groups``
take two passes over chunks of ``block_groups`` (statistics, then update; the
second pass mostly from L2).

The update is issue-bound. On an H200 Nsight Compute counted 43 instructions
per weight (session 7, before the changes below), an issue floor of 86 us at
8192^2 in either gradient dtype, against 107 us for 80% of copy bandwidth
with float32 gradients and 68 us with bfloat16. Offline SASS counts
(``benchmarks/offline_ptx.py counter_update OUT IN DTYPE --sass``: the
``triton`` package's ptxas for sm_90, heuristic configs; not measured on a
GPU), instructions per weight, main at 7fbab3d -> now:

=================  =============  ==============
shape              float32        bfloat16
=================  =============  ==============
8192 x 8192        38.9 -> 30.9   40.1 -> 31.9
4096 x 4096        44.3 -> 35.4
1536 x 2304        47.6 -> 37.8   48.8 -> 39.3
=================  =============  ==============

Measured on an H200 (2026-12-03, device time, heuristic configs, against a
frozen copy of the kernel at 7fbab3d in the same run, bit for bit equal): 8192^2
bfloat16 107.6 us against 120.8, 1000 x 3996 float32 11.0 against 11.8,
1536 x 2304 float32 8.5 against 9.5, but 8192^2 float32 130.1 against 124.3
(66% of copy bandwidth against 69%): fewer instructions, yet more cycles
stalled on memory per instruction there (Nsight Compute, session 16).

What keeps the per-element work low:

* packed codes are read and written as uint32 words (three per 16 codes)
  where rows allow, gradients in 16-byte vectors (bfloat16 ones of word units
  as uint32 pairs, widened by a shift or a mask: :func:`widen_bfloat16_pairs`);
* a code's centre is read straight from its packed field, with no unpack
  (:func:`reference.word_centers`: one logic op and one add), and its ternary
  value from the centre (:func:`reference.ternary_of_center`), so
  ``sum g * t`` adds one multiply-add per element, in the order it always had;
* the draw's stream keys are formed once in XLA (:func:`reference.kernel_words`),
  and the hash's last shift is folded into the draw
  (:func:`jaxnoise.noise.uniform01_of_word`);
* the rounded value is clipped before its floor, so the floor is a plain
  truncation (:func:`reference.tick`), compiled as one ``cvt.rzi.u32.f32``
  (:func:`truncate_codes`);
* new codes are packed by shift-adds (:func:`reference.pack_words`);
* whole tiles are loaded without masks (only a ragged last chunk is masked),
  and rows that are skipped are not stored at all (the codes are aliased in
  place), so no per-element select.

Update from the layer's input and output gradient
-------------------------------------------------
``grad_out^T x`` is formed tile by tile with ``dot_general`` (float32
accumulation) and never written out. When a tile spans whole rows (short
rows), one kernel forms the tile, reduces the row statistics and updates it.
Otherwise a statistics kernel writes per-tile partial sums, the per-row
scalars are formed in XLA, and an update kernel recomputes each tile and
updates its codes: two GEMM-equivalents of work, no dense gradient.

With ``FromIOConfig.xla_gemm_rows`` XLA's GEMM forms a block of rows at a
time instead and the dense-gradient kernel updates those rows of the whole
state in place (its ``row_block``: the block index is an operand, the
skipped flags are the layer's, aliased), so a ``fori_loop`` over the blocks
copies no state. Session 21 measured the form that sliced the state per
block: 30-156 us of device copies per call at 4096x4096.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxnoise.ops.ternary import reference as ref_lib
from jaxnoise.ops.ternary.config import CounterUpdateConfig, FromIOConfig, check_config
from jaxnoise.ops.ternary.pallas_triton import (
    UnitLayout,
    _call,
    _cdiv,
    _dot_setup,
    _I32,
    _iota,
    _load_vector,
    _loop,
    _store_vector,
    bfloat16_pair_units,
    dense_units,
    load_dense_lanes,
    load_unit_centers,
    load_unit_fields,
    opaque_copy,
    unit_centers,
    packed_bytes,
    packed_units,
    split_lanes,
    store_unit_codes,
    truncate_codes,
    unit_layout,
    widen_bfloat16_pairs,
)

__all__ = ["counter_update", "counter_update_from_io"]

_F32 = jnp.float32
# Contract dim 0 of both operands: grad_out^T (BM, BR) x (BM, BG) -> (BR, BG).
_DIMS_TN = (((0,), (0,)), ((), ()))


def _read_hyper(hyper_ref):
  return tuple(hyper_ref[k] for k in range(4))


def _read_stream(words_ref):
  """``(seed, multiplier, increment)`` of :func:`ref_lib.kernel_words`."""
  return tuple(words_ref[k] for k in range(3))


def _tile_stats(centers, grads, C):
  """Row sums ``sum(g**2)`` and ``sum(g * t)`` of a tile's lanes (masked entries are 0).

  ``centers`` are the lanes' ``(centre * 2**shift, shift)``; ``t`` comes from
  the centre (:func:`ref_lib.ternary_of_center`), so ``g * t`` is exact and
  each lane adds one multiply-add, in lane order.
  """
  squares = sum(g * g for g in grads)
  signed = sum(g * ref_lib.ternary_of_center(center, shift, C)
               for (center, shift), g in zip(centers, grads))
  return jnp.sum(squares, axis=1), jnp.sum(signed, axis=1)


def _tick_lanes(stream, rows, units, centers, grads, ratio, step, *, C, codes_per_unit,
                in_features, high_word, interpret):
  """New uint32 code lanes of a tile (stochastic rounding at ``(seed, row * in + col)``).

  A centre scaled by ``2**shift`` meets ``ratio * 2**-shift`` (exact), so the
  product and the rounded value are those of the centre.
  """
  rows_u = rows.astype(jnp.uint32)[:, None]
  first_cols = (units * codes_per_unit).astype(jnp.uint32)[None, :]
  draws = ref_lib.rounding_draw_run(stream, rows_u, first_cols, codes_per_unit, in_features,
                                    high_word)
  ratios = {shift: ratio * _F32(2.0**-shift) for shift in sorted({s for _, s in centers})}
  return [truncate_codes(ref_lib.rounded_target(center, grad, u, ratios[shift], step, C),
                         interpret)
          for (center, shift), grad, u in zip(centers, grads, draws)]


def _counter_update_kernel(hyper_ref, words_ref, grad_ref, *refs, C, lagged,
                           layout: UnitLayout, n_rows, n_units, block_rows, chunks, loop_units,
                           vector, bf16_pairs, high_word, row_block, interpret):
  """One program: ``block_rows`` whole rows, in static chunks (or a two-pass loop).

  Gradient rows ``r`` update state rows ``r + base``: ``base`` is 0, or with
  ``row_block`` (the rows of a layer's block) ``block_index_ref[0] *
  row_block``, where the state (``skipped`` included) is the whole layer's.
  """
  if row_block:
    (block_index_ref, packed_ref, scale_ref, v_ref, _, packed_out_ref, scale_out_ref, v_out_ref,
     skipped_ref) = refs
  else:
    packed_ref, scale_ref, v_ref, packed_out_ref, scale_out_ref, v_out_ref, skipped_ref = refs
  r0 = pl.program_id(0) * block_rows
  traced_zero = r0 * 0
  rows = r0 + _iota(block_rows)
  row_mask = rows < n_rows
  s0 = r0 + block_index_ref[0] * row_block if row_block else r0  # the first state row
  state_rows = s0 + _iota(block_rows) if row_block else rows
  hyper = _read_hyper(hyper_ref)
  stream = _read_stream(words_ref)
  bias_bits = words_ref[3]
  scale = _load_vector(scale_ref, s0, block_rows, row_mask, 1.0)
  v = _load_vector(v_ref, s0, block_rows, row_mask, 0.0)
  per_unit = layout.codes
  in_features = per_unit * n_units

  # Whole tiles (every row of the program and every unit inside the row) are
  # loaded without masks; only a ragged last chunk or row block is masked.
  whole_rows = n_rows % block_rows == 0

  def load(u0, size, whole):
    if not whole:
      # A traced start: JAX rejects static slices that start inside the array and end
      # past it; the masks handle the tail.
      u0 = u0 + traced_zero
    units = u0 + _iota(size)
    mask = None if whole else row_mask[:, None] & (units < n_units)[None, :]
    fields = load_unit_fields(packed_ref, s0, block_rows, u0, size, mask)
    if bf16_pairs:
      words = load_dense_lanes(grad_ref, r0, block_rows, u0, size, per_unit // 2, vector, mask)
      return u0, units, mask, fields, widen_bfloat16_pairs(words)
    grads = load_dense_lanes(grad_ref, r0, block_rows, u0, size, per_unit, vector, mask)
    return u0, units, mask, fields, [g.astype(_F32) for g in grads]

  def finish_rows(sum_sq, sum_gt):
    scale_new, v_new, ratio, step, active = ref_lib.row_update(
        sum_sq, sum_gt, scale, v, hyper, in_features=in_features, C=C, lagged=lagged)
    _store_vector(scale_out_ref, s0, block_rows, scale_new, row_mask)
    _store_vector(v_out_ref, s0, block_rows, v_new, row_mask)
    _store_vector(skipped_ref, s0, block_rows, (~active).astype(_I32), row_mask)
    return ratio[:, None], step[:, None], active[:, None]

  def update(size, u0, units, mask, fields, grads, ratio, step, active):
    # The centres again from the packed fields, which stay live across the row's
    # reduction: the centres themselves (a float per code) cost a block of 8 warps per
    # multiprocessor (95 registers against 80); loading the fields again made the
    # kernel wait on memory.
    centers = unit_centers([opaque_copy(f, interpret) for f in fields], layout, C, bias_bits)
    new_codes = _tick_lanes(stream, state_rows, units, centers, grads, ratio, step, C=C,
                            codes_per_unit=per_unit, in_features=in_features,
                            high_word=high_word, interpret=interpret)
    # Skipped rows are not written: the codes are updated in place, so they keep theirs.
    store_mask = jnp.broadcast_to(active, (block_rows, size)) if mask is None else mask & active
    store_unit_codes(packed_out_ref, s0, block_rows, u0, size, new_codes, store_mask, layout)

  if loop_units is None:
    # The whole row in registers: one read of the gradient and the codes.
    tiles = [(size, *load(u0, size, whole_rows and u0 + size <= n_units))
             for u0, size in chunks]
    sums = [_tile_stats(unit_centers(tile[4], layout, C, bias_bits), tile[5], C)
            for tile in tiles]
    ratio, step, active = finish_rows(sum(s[0] for s in sums), sum(s[1] for s in sums))
    for tile in tiles:
      update(*tile, ratio, step, active)
    return

  n_loop = _cdiv(n_units, loop_units)
  whole_loop = whole_rows and n_units % loop_units == 0

  def accumulate(j, totals):
    _, _, _, fields, grads = load(j * loop_units, loop_units, whole_loop)
    tile_sq, tile_gt = _tile_stats(unit_centers(fields, layout, C, bias_bits), grads, C)
    return totals[0] + tile_sq, totals[1] + tile_gt

  zeros = jnp.zeros((block_rows,), _F32)
  ratio, step, active = finish_rows(*jax.lax.fori_loop(0, n_loop, accumulate, (zeros, zeros)))

  def apply(j, carry):
    update(loop_units, *load(j * loop_units, loop_units, whole_loop), ratio, step, active)
    return carry

  jax.lax.fori_loop(0, n_loop, apply, ())


def counter_update(packed, scale, v, grad_w, hyper, seed, *, C: int, lagged: bool,
                   config: CounterUpdateConfig | None = None, interpret: bool = False,
                   row_block=None):
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
    row_block: None, or ``(index, rows, skipped)``: ``packed``, ``scale`` and
      ``v`` are then a whole layer's state, ``grad_w`` the gradient of its
      rows from ``index * rows`` (``index`` an int32 scalar, may be traced;
      ``rows`` an int) and ``skipped`` the layer's ``(layer_rows,)`` int32
      flags. The kernel updates those rows in place, with the layer's
      rounding draws, and keeps the others. The caller keeps the rows inside
      the layer.

  Returns:
    ``(packed, scale, v, skipped)``: ``skipped`` an ``(out,)`` bool, or with
    ``row_block`` the layer's int32 flags.
  """
  out_features, in_features = grad_w.shape
  layer_rows = scale.shape[0]
  if check_config(config, CounterUpdateConfig) is None:
    config = CounterUpdateConfig.get_heuristics_config(grad_w.shape, grad_w.dtype)
  layout = unit_layout(in_features, config.uses_words(in_features))
  per_unit = layout.codes
  group_scale = per_unit // 4  # groups per unit
  n_units = in_features // per_unit
  chunks = config.row_chunks(in_features // 4)
  if chunks is None:
    loop_units, unit_chunks = max(1, config.block_groups // group_scale), None
  else:
    loop_units = None
    unit_chunks = tuple((start // group_scale, max(1, size // group_scale))
                        for start, size in chunks)
  # bfloat16 gradients of word units are read as uint32 pairs and widened by shift / mask
  # (offline at sm_90: 0.3-0.5 fewer SASS instructions per weight; 0.4 more in byte units).
  bf16_pairs = layout.words and jnp.dtype(grad_w.dtype) == jnp.dtype(jnp.bfloat16)
  if bf16_pairs:
    grad_units, lanes_per_unit, itemsize = bfloat16_pair_units(grad_w, per_unit), per_unit // 2, 4
  else:
    grad_units, lanes_per_unit = dense_units(grad_w, per_unit), per_unit
    itemsize = jnp.dtype(grad_w.dtype).itemsize
  vector = 1
  if config.vector_loads:
    vector = min(lanes_per_unit, max(1, 16 // itemsize))
  kernel = functools.partial(
      _counter_update_kernel, C=C, lagged=lagged, layout=layout, n_rows=out_features,
      n_units=n_units, block_rows=config.block_rows, chunks=unit_chunks, loop_units=loop_units,
      vector=vector, bf16_pairs=bf16_pairs,
      high_word=ref_lib.needs_high_word(layer_rows, in_features),
      row_block=row_block[1] if row_block else None, interpret=interpret)
  units = packed_units(packed, layout)
  out_shape = (
      jax.ShapeDtypeStruct(units.shape, units.dtype),
      jax.ShapeDtypeStruct((layer_rows,), _F32),
      jax.ShapeDtypeStruct((layer_rows,), _F32),
      jax.ShapeDtypeStruct((layer_rows,), _I32),
  )
  operands = (hyper, ref_lib.kernel_words(seed), grad_units, units, scale, v)
  aliases = {3: 0, 4: 1, 5: 2}
  if row_block:
    index, _, skipped = row_block
    operands = (*operands[:3], jnp.asarray(index, _I32).reshape(1), *operands[3:], skipped)
    aliases = {4: 0, 5: 1, 6: 2, 7: 3}
  new_units, new_scale, new_v, skipped = _call(
      kernel, name="ternary_counter_update", grid=(_cdiv(out_features, config.block_rows),),
      out_shape=out_shape, config=config, interpret=interpret, input_output_aliases=aliases,
  )(*operands)
  if row_block:
    return packed_bytes(new_units, layout), new_scale, new_v, skipped
  return packed_bytes(new_units, layout), new_scale, new_v, skipped.astype(jnp.bool_)


# ----------------------------------------------------------------------------
# Counter update from the layer's input and output gradient.


def _io_gradient_tile(x_ref, grad_out_ref, r0, u0, row_mask, *, n_cols, m_rows, block_rows,
                      block_units, per_unit, block_m, compute_dtype, precision):
  """The ``L`` lanes of ``grad_out^T x`` on a ``(block_rows, block_units)`` unit tile (float32).

  Each step meets a ``(block_m, block_rows)`` tile of ``grad_out`` and a
  contiguous ``(block_m, block_units * L)`` tile of ``x`` in one
  ``dot_general`` (float32 accumulation, natural column order); the
  accumulator is split into lanes once, after the reduction over ``M``.
  """
  width = block_units * per_unit
  col_mask = (u0 * per_unit + _iota(width)) < n_cols

  def step(i, acc):
    m0 = i * block_m
    m_mask = (m0 + _iota(block_m)) < m_rows
    grad_out = plgpu.load(grad_out_ref.at[pl.ds(m0, block_m), pl.ds(r0, block_rows)],
                          mask=m_mask[:, None] & row_mask[None, :], other=0)
    x = plgpu.load(x_ref.at[pl.ds(m0, block_m), pl.ds(u0 * per_unit, width)],
                   mask=m_mask[:, None] & col_mask[None, :], other=0)
    return acc + jax.lax.dot_general(grad_out.astype(compute_dtype), x.astype(compute_dtype),
                                     _DIMS_TN, precision=precision,
                                     preferred_element_type=_F32)

  acc = _loop(_cdiv(m_rows, block_m), step, jnp.zeros((block_rows, width), _F32))
  return split_lanes(acc.reshape(block_rows, block_units, per_unit))


def _io_tile(x_ref, grad_out_ref, packed_ref, r0, u0, *, C, layout, n_rows, n_units, m_rows,
             block_rows, block_units, block_m, compute_dtype, precision,
             bias_bits=ref_lib.FLOAT_BIAS_BITS):
  """Rows, units, masks, code lanes (as centres) and gradient lanes of one from-IO tile."""
  rows = r0 + _iota(block_rows)
  units = u0 + _iota(block_units)
  row_mask = rows < n_rows
  mask = row_mask[:, None] & (units < n_units)[None, :]
  grads = _io_gradient_tile(
      x_ref, grad_out_ref, r0, u0, row_mask, n_cols=n_units * layout.codes, m_rows=m_rows,
      block_rows=block_rows,
      block_units=block_units, per_unit=layout.codes, block_m=block_m,
      compute_dtype=compute_dtype, precision=precision)
  centers = load_unit_centers(packed_ref, r0, block_rows, u0, block_units, mask, layout, C,
                              bias_bits)
  return rows, units, row_mask, mask, centers, grads


def _io_fused_kernel(hyper_ref, words_ref, x_ref, grad_out_ref, packed_ref, scale_ref, v_ref,
                     packed_out_ref, scale_out_ref, v_out_ref, skipped_ref, *, C, lagged,
                     high_word, interpret, **tile):
  """One tile spans whole rows: gradient tile, row statistics and update in one program."""
  r0 = pl.program_id(0) * tile["block_rows"]
  layout, block_rows = tile["layout"], tile["block_rows"]
  rows, units, row_mask, mask, centers, grads = _io_tile(x_ref, grad_out_ref, packed_ref, r0,
                                                         0, C=C, bias_bits=words_ref[3], **tile)
  sum_sq, sum_gt = _tile_stats(centers, grads, C)
  in_features = layout.codes * tile["n_units"]
  scale = _load_vector(scale_ref, r0, block_rows, row_mask, 1.0)
  v = _load_vector(v_ref, r0, block_rows, row_mask, 0.0)
  scale_new, v_new, ratio, step, active = ref_lib.row_update(
      sum_sq, sum_gt, scale, v, _read_hyper(hyper_ref), in_features=in_features, C=C,
      lagged=lagged)
  _store_vector(scale_out_ref, r0, block_rows, scale_new, row_mask)
  _store_vector(v_out_ref, r0, block_rows, v_new, row_mask)
  _store_vector(skipped_ref, r0, block_rows, (~active).astype(_I32), row_mask)
  new_codes = _tick_lanes(_read_stream(words_ref), rows, units, centers, grads, ratio[:, None],
                          step[:, None], C=C, codes_per_unit=layout.codes,
                          in_features=in_features, high_word=high_word, interpret=interpret)
  store_unit_codes(packed_out_ref, r0, block_rows, 0, tile["block_units"], new_codes,
                   mask & active[:, None], layout)


def _io_stats_kernel(x_ref, grad_out_ref, packed_ref, sum_sq_ref, sum_gt_ref, *, C, **tile):
  """Partial row statistics of one tile (``(out, tiles)`` outputs)."""
  r0 = pl.program_id(0) * tile["block_rows"]
  index = pl.program_id(1)
  _, _, row_mask, _, centers, grads = _io_tile(x_ref, grad_out_ref, packed_ref, r0,
                                               index * tile["block_units"], C=C, **tile)
  sum_sq, sum_gt = _tile_stats(centers, grads, C)
  plgpu.store(sum_sq_ref.at[pl.ds(r0, tile["block_rows"]), index], sum_sq, mask=row_mask)
  plgpu.store(sum_gt_ref.at[pl.ds(r0, tile["block_rows"]), index], sum_gt, mask=row_mask)


def _io_apply_kernel(words_ref, x_ref, grad_out_ref, ratio_ref, step_ref, active_ref, packed_ref,
                     packed_out_ref, *, C, high_word, interpret, **tile):
  """Recompute one tile's gradient and update its codes (skipped rows are not stored)."""
  block_rows, layout = tile["block_rows"], tile["layout"]
  r0 = pl.program_id(0) * block_rows
  u0 = pl.program_id(1) * tile["block_units"]
  rows, units, row_mask, mask, centers, grads = _io_tile(x_ref, grad_out_ref, packed_ref, r0,
                                                         u0, C=C, bias_bits=words_ref[3], **tile)
  ratio = _load_vector(ratio_ref, r0, block_rows, row_mask, 1.0)[:, None]
  step = _load_vector(step_ref, r0, block_rows, row_mask, 0.0)[:, None]
  active = (_load_vector(active_ref, r0, block_rows, row_mask, 0) != 0)[:, None]
  new_codes = _tick_lanes(_read_stream(words_ref), rows, units, centers, grads, ratio, step, C=C,
                          codes_per_unit=layout.codes, in_features=layout.codes * tile["n_units"],
                          high_word=high_word, interpret=interpret)
  store_unit_codes(packed_out_ref, r0, block_rows, u0, tile["block_units"], new_codes,
                   mask & active, layout)


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
  if check_config(config, FromIOConfig) is None:
    config = FromIOConfig.get_heuristics_config(
        (m_rows, out_features, in_features), jnp.promote_types(x.dtype, grad_out.dtype))
  compute_dtype, precision = _dot_setup(x.dtype, grad_out.dtype, config.allow_tf32)
  if config.xla_gemm_rows is not None:
    return _from_io_by_row_blocks(
        packed, scale, v, x.astype(compute_dtype), grad_out.astype(compute_dtype), hyper, seed,
        C=C, lagged=lagged, block=min(config.xla_gemm_rows, out_features), precision=precision,
        interpret=interpret)
  high_word = ref_lib.needs_high_word(out_features, in_features)
  layout = unit_layout(in_features, config.word_loads and config.block_groups >= 4)
  n_units = in_features // layout.codes
  block_units = max(1, config.block_groups * 4 // layout.codes)
  tile = dict(layout=layout, n_rows=out_features, n_units=n_units, m_rows=m_rows,
              block_rows=config.block_rows, block_units=block_units, block_m=config.block_m,
              compute_dtype=compute_dtype, precision=precision)
  n_row_blocks = _cdiv(out_features, config.block_rows)
  units = packed_units(packed, layout)

  if config.fused(in_features):
    kernel = functools.partial(_io_fused_kernel, C=C, lagged=lagged, high_word=high_word,
                               interpret=interpret, **tile)
    out_shape = (
        jax.ShapeDtypeStruct(units.shape, units.dtype),
        jax.ShapeDtypeStruct((out_features,), _F32),
        jax.ShapeDtypeStruct((out_features,), _F32),
        jax.ShapeDtypeStruct((out_features,), _I32),
    )
    new_units, new_scale, new_v, skipped = _call(
        kernel, name="ternary_counter_update_from_io", grid=(n_row_blocks,),
        out_shape=out_shape, config=config, interpret=interpret,
        input_output_aliases={4: 0, 5: 1, 6: 2},
    )(hyper, ref_lib.kernel_words(seed), x, grad_out, units, scale, v)
    return packed_bytes(new_units, layout), new_scale, new_v, skipped.astype(jnp.bool_)

  n_tiles = _cdiv(n_units, block_units)
  grid = (n_row_blocks, n_tiles)
  partial_shape = jax.ShapeDtypeStruct((out_features, n_tiles), _F32)
  sum_sq, sum_gt = _call(
      functools.partial(_io_stats_kernel, C=C, **tile), name="ternary_from_io_stats", grid=grid,
      out_shape=(partial_shape, partial_shape), config=config, interpret=interpret,
  )(x, grad_out, units)
  new_scale, new_v, ratio, step, active = ref_lib.row_update(
      sum_sq.sum(axis=1), sum_gt.sum(axis=1), scale, v, hyper, in_features=in_features, C=C,
      lagged=lagged)
  new_units = _call(
      functools.partial(_io_apply_kernel, C=C, high_word=high_word, interpret=interpret, **tile),
      name="ternary_from_io_update", grid=grid,
      out_shape=jax.ShapeDtypeStruct(units.shape, units.dtype), config=config,
      interpret=interpret, input_output_aliases={6: 0},
  )(ref_lib.kernel_words(seed), x, grad_out, ratio, step, active.astype(_I32), units)
  return packed_bytes(new_units, layout), new_scale, new_v, ~active


def _from_io_by_row_blocks(packed, scale, v, x, grad_out, hyper, seed, *, C: int, lagged: bool,
                           block: int, precision, interpret: bool):
  """``FromIOConfig.xla_gemm_rows``: XLA's GEMM forms ``block`` rows of the gradient at a
  time, the dense-gradient kernel updates those rows of the whole state in place.

  Rows are independent (each has its own statistics, scale and ``v``, and the
  kernel draws at the layer's row), so the blocks give the update of the whole
  gradient. A ``fori_loop`` walks the whole blocks (one kernel compile however
  tall the layer, and one block's gradient alive at a time), and a ragged last
  block runs once after it.
  """
  out_features = grad_out.shape[1]

  def update_rows(index, size, state):
    block_grad_out = jax.lax.dynamic_slice_in_dim(grad_out, index * block, size, axis=1)
    gradient = jax.lax.dot_general(block_grad_out, x, _DIMS_TN, precision=precision,
                                   preferred_element_type=_F32)
    packed, scale, v, skipped = state
    return counter_update(packed, scale, v, gradient, hyper, seed, C=C, lagged=lagged,
                          interpret=interpret, row_block=(index, block, skipped))

  n_whole = out_features // block
  state = (packed, scale, v, jnp.zeros((out_features,), _I32))
  state = jax.lax.fori_loop(0, n_whole, lambda i, s: update_rows(i, block, s), state)
  if out_features % block:
    state = update_rows(n_whole, out_features % block, state)
  packed, scale, v, skipped = state
  return packed, scale, v, skipped.astype(jnp.bool_)
