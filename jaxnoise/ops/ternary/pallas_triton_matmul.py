"""Pallas (Triton) kernels of the packed ternary matmul and its input gradient.

Forward (:func:`ternary_matmul`), by ``MatmulConfig.method``:

* ``"dot"``: ``(block_m, block_n)`` output tiles; the packed codes of a tile's
  rows are read (0.75 byte per weight from memory) and decoded per code lane
  in registers, and each lane meets the matching lane of ``x`` (``x`` is
  brought to the codes' order, not the codes to ``x``'s) in one
  ``dot_general`` per lane and step. ``split_k > 1``
  cuts ``in`` into that many slabs, one program each, and XLA sums the float32
  partial tiles: for decode-sized ``M`` (GEMV) the grid then has enough
  programs to stream the weights with every SM (``out / block_n`` alone is
  far fewer than the GPU's SMs at ``out = 4096``).
* ``"fma"``: the same tiles without tensor cores, for one to four rows
  (decode steps): ``t`` once per weight and one multiply-add per row, so the
  rows share the decode.
* ``"wgmma"`` (Hopper): not here, in :mod:`jaxnoise.ops.ternary.mosaic_gpu_matmul`
  (:func:`ternary_matmul` hands such configs over).
* ``"decode"``: ``t`` decoded to a dense matrix, then an XLA GEMM (large
  ``M``), in the compute dtype (int4 nibbles, which XLA's GEMM would convert
  in its prologue, came out wrong from that GEMM on an H200 with jax 0.11.2:
  ``benchmarks/check_int4_gemm.py``).

Both tiled methods form ``t`` from the packed fields with two clamped float
adds per code (:func:`ref_lib.field_ternary`: ``add.rn.sat.f32`` compiled), one
integer instruction per code sitting in one word where compares and selects
took five; dot tiles convert it to the compute dtype (exact).

Input gradient (:func:`ternary_matmul_input_grad`): dot tiles, ``out`` split
into ``split_k`` slabs for few rows, or ``"decode"``.

float32 operands meet ``t`` (exact in bfloat16) as three bfloat16 pieces
(:func:`bf16_pieces`, ``MatmulConfig.split_float32``): bfloat16 tensor cores
with exact products, where a float32 dot keeps its products exact only on
CUDA cores.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxnoise.ops import _pallas
from jaxnoise.ops.ternary import mosaic_gpu_matmul
from jaxnoise.ops.ternary import pallas_triton as elementwise
from jaxnoise.ops.ternary import reference as ref_lib
from jaxnoise.ops.ternary.config import MatmulConfig, check_config
from jaxnoise.ops.ternary.pallas_triton import (
    UnitLayout,
    _call,
    _cdiv,
    _dot_setup,
    _iota,
    _load_codes,
    _load_lanes,
    _load_vector,
    _loop,
    _packed_view,
    _store_lanes,
    interleave,
    load_ramp_bases,
    packed_units,
    ramp_bases,
    split_lanes,
    unit_layout,
    unit_ternary,
)

__all__ = ["bf16_pieces", "ternary_matmul", "ternary_matmul_input_grad"]

_F32 = jnp.float32
_BF16 = jnp.bfloat16
_I32 = jnp.int32
_U32 = jnp.uint32
# x (BM, BG) . t (BN, BG)^T -> (BM, BN).
_DIMS_NT = (((1,), (1,)), ((), ()))
# g (BM, BN) . t (BN, BG) -> (BM, BG).
_DIMS_NN = (((1,), (0,)), ((), ()))


def bf16_pieces(x):
  """float32 ``x`` as three bfloat16 arrays whose float32 sum is ``x`` exactly.

  ``hi`` keeps the top 8 significant bits of ``x`` (truncated, so it never
  overflows), ``mid`` the top 8 of the rest and ``lo`` the remaining ones (at
  most 8, so exact in bfloat16). A product of a piece with -1, 0 or +1 is
  exact, so dots of the pieces with ``t`` in float32 accumulation give a
  float32 dot's result up to the order of its sums. Infinities sit in ``hi``
  alone (``mid = lo = 0``); NaN reaches every piece. Works in XLA and inside
  Pallas kernels.

  The sum is exact for ``|x| >= 2**-103`` (about 1e-31). Below, a piece may
  be subnormal, and XLA and the GPU flush subnormals to zero: the sum then
  misses less than ``2**-125`` (about 2.4e-38).

  Example:
    >>> x = jnp.array([1 / 3, -2.5e-8, 3.4e38], jnp.float32)  # 3.4e38 > bfloat16's max
    >>> hi, mid, lo = bf16_pieces(x)
    >>> bool(jnp.all(hi.astype(jnp.float32) + mid.astype(jnp.float32)
    ...              + lo.astype(jnp.float32) == x))
    True
  """
  hi = _truncate_to_bf16(x)
  rest = jnp.where(x == hi, _F32(0.0), x - hi)  # exact; inf - inf would be NaN
  mid = _truncate_to_bf16(rest)
  return hi.astype(_BF16), mid.astype(_BF16), (rest - mid).astype(_BF16)


def _truncate_to_bf16(x):
  """float32 ``x`` with the low 16 bits of its pattern cleared (exact in bfloat16)."""
  bits = jax.lax.bitcast_convert_type(x, _U32) & _U32(0xFFFF0000)
  return jax.lax.bitcast_convert_type(bits, _F32)


def _operand_setup(dtype, config: MatmulConfig):
  """``(operand dtype, split into bf16 pieces, precision)`` of a dot with ``t``."""
  compute_dtype, precision = _dot_setup(dtype, dtype, config.allow_tf32)
  split = (config.split_float32 and not config.allow_tf32
           and jnp.dtype(compute_dtype) == jnp.dtype(_F32))
  if split:
    return jnp.dtype(_BF16), True, jax.lax.Precision.DEFAULT
  return compute_dtype, False, precision


def _dot_with_t(operand, t, dims, *, split, precision, t_left=False):
  """``dot_general(operand, t)`` in float32; ``operand`` as its bf16 pieces when ``split``.

  ``t_left``: ``dot_general(t, operand)`` instead (``t`` the left operand).
  """
  def dot(a, precision):
    lhs, rhs = (t, a) if t_left else (a, t)
    return jax.lax.dot_general(lhs, rhs, dims, precision=precision,
                               preferred_element_type=_F32)

  if not split:
    return dot(operand, precision)
  acc = None
  for piece in bf16_pieces(operand):
    part = dot(piece, None)
    acc = part if acc is None else acc + part
  return acc


def _xla_dot_with_t(operand, t, dims, *, split, precision):
  """:func:`_dot_with_t` as one XLA GEMM: the pieces stacked along the rows of ``operand``."""
  if not split:
    return _dot_with_t(operand, t, dims, split=False, precision=precision)
  rows = operand.shape[0]
  stacked = jnp.concatenate(bf16_pieces(operand), axis=0)
  out = jax.lax.dot_general(stacked, t, dims, preferred_element_type=_F32)
  return jnp.sum(out.reshape((3, rows) + out.shape[1:]), axis=0)


def _matmul_kernel(x_ref, packed_ref, scale_ref, bases_ref, y_ref, *, C, layout: UnitLayout,
                   m_rows, n_out, n_units, block_m, block_n, block_units, steps_per_split, method,
                   compute_dtype, precision, partial_sums, x_vector=1, split_float32=False,
                   interleave_lanes=False, weights_lhs=False, register_prefetch=False,
                   compiled=True):
  """One ``(block_m, block_n)`` output tile over one split of ``in``.

  ``x_ref`` holds ``x`` in lane order, ``(M, L, units)`` with
  ``x_ref[m, j, u] = x[m, u * L + j]`` (:func:`x_lanes`), in the compute
  dtype for ``"dot"``; for ``"fma"`` it is ``x`` itself viewed as
  ``(M, units, L)``, read ``x_vector`` consecutive lanes per (16-byte) load
  and split into lanes in registers (``x_vector=1``: one strided load per
  lane; :func:`_x_operand`).
  Each step loads ``block_units`` packed units per output row (three strided
  word or byte lanes), finds each code lane's ternary value in float32 (on
  the words in place where a code ends at or below bit 29,
  :func:`ref_lib.word_ternary`; ``bases_ref`` holds :data:`ref_lib.RAMP_BASES`
  so that they sit in registers) and meets the matching
  ``(block_m, block_units)`` lane of ``x``: every tensor keeps the
  ``(rows, units)`` shape of the loads, so no code or ``x`` tile is reordered
  in registers.

  * ``method="dot"``: ``t`` of each lane converted to the compute dtype
    (exact), one ``dot_general`` per lane and step (tensor cores; float32
    accumulation); with ``split_float32``, ``x`` is float32 and meets ``t`` in
    bfloat16 as three pieces (:func:`bf16_pieces`), one dot each. With
    ``interleave_lanes`` the lanes are joined into one tile of ``t`` in
    ``x``'s column order (:func:`interleave`) and ``x_ref`` is ``x`` itself,
    ``(M, in)``: one dot per step. With ``register_prefetch`` step ``i +
    1``'s loads are issued before step ``i``'s decode and dot;
  * ``method="fma"`` (no tensor cores: for a few rows, where a dot pads to
    16): one ``fma.rn.f32`` of ``x`` and ``t`` per row and weight (exact
    products, so ``inf * 0`` is NaN as in the reference; each row's lanes
    loaded as ``(1, block_units)``, its own ``(block_n, block_units)``
    accumulator), so the rows share the decode.
  """
  m0 = pl.program_id(0) * block_m
  n0 = pl.program_id(1) * block_n
  split = pl.program_id(2)
  n_lanes = layout.codes
  bases = load_ramp_bases(bases_ref)
  # Masks only along dimensions the tiles do not divide (None: every element is in range).
  m_mask = None if m_rows % block_m == 0 else (m0 + _iota(block_m)) < m_rows
  n_mask = None if n_out % block_n == 0 else (n0 + _iota(block_n)) < n_out
  units_even = n_units % (steps_per_split * block_units) == 0
  first_unit = split * (steps_per_split * block_units)

  def fetch(i):
    """Step ``i``'s three packed lanes ``(block_n, block_units)`` and ``L`` lanes of ``x``."""
    u0 = first_unit + i * block_units
    unit_mask = None if units_even else (u0 + _iota(block_units)) < n_units
    raw = _load_lanes(packed_ref, n0, block_n, u0, block_units, 3,
                      _outer_and(n_mask, unit_mask, (block_n, block_units)), 0)
    if method == "fma":
      return tuple(raw), fetch_x_rows(u0, unit_mask)
    if interleave_lanes:  # x as it is, (M, in): the step's block_units * L columns.
      width = block_units * n_lanes
      col_mask = None if unit_mask is None else (u0 * n_lanes + _iota(width)) < n_units * n_lanes
      x_mask = _outer_and(m_mask, col_mask, (block_m, width))
      x = plgpu.load(x_ref.at[pl.ds(m0, block_m), pl.ds(u0 * n_lanes, width)],
                     mask=x_mask, other=None if x_mask is None else 0)
      return tuple(raw), x
    # (M, L, units): lane j is a contiguous row of units.
    x_mask = _outer_and(m_mask, unit_mask, (block_m, block_units))
    xs = [plgpu.load(x_ref.at[pl.ds(m0, block_m), _I32(j), pl.ds(u0, block_units)],
                     mask=x_mask, other=None if x_mask is None else 0)
          for j in range(n_lanes)]
    return tuple(raw), tuple(xs)

  def fetch_x_rows(u0, unit_mask):
    """Per row of the tile, its ``L`` lanes of ``x`` (``(M, units, L)``) as ``(1, block_units)``.

    ``x_vector`` consecutive lanes per (16-byte) load, split in registers, or
    (``x_vector=1``) lane ``j`` strided, every ``L``-th element of the row.
    Rows past ``M`` read row ``M - 1`` (their sums are not stored).
    """
    x_mask = None if unit_mask is None else unit_mask[None, :]
    rows = []
    for r in range(block_m):
      row = m0 + r if r else m0
      row = row if m_mask is None else jnp.minimum(row, m_rows - 1)
      if x_vector > 1:
        lanes = []
        for first in range(0, n_lanes, x_vector):
          window = x_ref.at[pl.ds(row, 1), pl.ds(u0, block_units), pl.ds(first, x_vector)]
          lanes.extend(split_lanes(plgpu.load(window) if x_mask is None else
                                   plgpu.load(window, mask=x_mask[:, :, None], other=0)))
      else:
        lanes = [plgpu.load(x_ref.at[pl.ds(row, 1), pl.ds(u0, block_units), _I32(j)],
                            mask=x_mask, other=None if x_mask is None else 0)
                 for j in range(n_lanes)]
      rows.append(tuple(lanes))
    return tuple(rows)

  if method == "fma":
    def accumulate_rows(accs, fetched):
      # Exact products (t is -1, 0 or +1), one rounding per multiply-add. Each row's
      # accumulator has the codes' (block_n, block_units) shape, so t meets x without a
      # layout conversion.
      raw, rows = fetched
      accs = list(accs)
      for j, t in enumerate(unit_ternary(raw, layout, C, bases, compiled=compiled)):
        for r, lanes in enumerate(rows):
          accs[r] = _pallas.fma(lanes[j].astype(_F32), t, accs[r], compiled=compiled)
      return tuple(accs)

    accs = (jnp.zeros((block_n, block_units), _F32),) * block_m
    accs = _loop(steps_per_split, lambda i, accs: accumulate_rows(accs, fetch(i)), accs)
    for r, acc in enumerate(accs):
      row_mask = None if m_mask is None else jnp.broadcast_to(m0 + r < m_rows, (1,))
      _store_tile(y_ref, scale_ref, jnp.sum(acc, axis=1)[None, :], m0=m0 + r, n0=n0,
                  split=split, m_mask=row_mask, n_mask=n_mask, partial_sums=partial_sums)
    return

  def accumulate(acc, fetched):
    raw, xs = fetched
    if interleave_lanes:  # one (block_n, block_units * L) tile of t in x's column order
      ts = [t.astype(compute_dtype) for t in unit_ternary(raw, layout, C, bases,
                                                          compiled=compiled)]
      if weights_lhs:  # (block_n, block_m): t the left operand
        return acc + _dot_with_t(xs, interleave(ts), _DIMS_NT, split=split_float32,
                                 precision=precision, t_left=True)
      return acc + _dot_with_t(xs, interleave(ts), _DIMS_NT, split=split_float32,
                               precision=precision)
    for t, x in zip(unit_ternary(raw, layout, C, bases, compiled=compiled), xs):
      t = t.astype(compute_dtype)  # -1, 0 or +1: exact
      acc = acc + _dot_with_t(x, t, _DIMS_NT, split=split_float32, precision=precision)
    return acc

  acc_shape = (block_n, block_m) if weights_lhs else (block_m, block_n)
  zeros = jnp.zeros(acc_shape, _F32)
  if register_prefetch and steps_per_split > 1:
    # Step i + 1's loads are issued before step i's decode and dot, and held in registers
    # (the last step reloads itself: its program's slab is never past the end).
    def prefetched(i, carry):
      acc, fetched = carry
      following = fetch(jnp.minimum(i + 1, steps_per_split - 1))
      return accumulate(acc, fetched), following

    acc, _ = _loop(steps_per_split, prefetched, (zeros, fetch(0)))
  else:
    acc = _loop(steps_per_split, lambda i, acc: accumulate(acc, fetch(i)), zeros)
  if weights_lhs:
    acc = acc.T

  _store_tile(y_ref, scale_ref, acc, m0=m0, n0=n0, split=split, m_mask=m_mask, n_mask=n_mask,
              partial_sums=partial_sums)


def _split_steps(n_steps: int, split_k: int) -> tuple[int, int]:
  """``(steps per program, programs)`` of a reduction of ``n_steps`` cut ``split_k`` ways."""
  steps_per_split = _cdiv(n_steps, max(1, min(split_k, n_steps)))
  return steps_per_split, _cdiv(n_steps, steps_per_split)


def _store_tile(y_ref, scale_ref, acc, *, m0, n0, split, m_mask, n_mask, partial_sums):
  """Stores a float32 ``(rows, block_n)`` tile at ``(m0, n0)``: a partial sum, or scaled."""
  block_m, block_n = acc.shape
  mask = _outer_and(m_mask, n_mask, (block_m, block_n))
  if partial_sums:
    plgpu.store(y_ref.at[split, pl.ds(m0, block_m), pl.ds(n0, block_n)], acc, mask=mask)
  else:
    scale = plgpu.load(scale_ref.at[pl.ds(n0, block_n)], mask=n_mask,
                       other=None if n_mask is None else 0.0).astype(_F32)
    plgpu.store(y_ref.at[pl.ds(m0, block_m), pl.ds(n0, block_n)],
                (acc * scale[None, :]).astype(y_ref.dtype), mask=mask)


def _outer_and(row_mask, col_mask, shape):
  """``row_mask[:, None] & col_mask[None, :]`` of ``shape``; either may be None (all true)."""
  if row_mask is None and col_mask is None:
    return None
  if row_mask is None:
    return jnp.broadcast_to(col_mask[None, :], shape)
  if col_mask is None:
    return jnp.broadcast_to(row_mask[:, None], shape)
  return row_mask[:, None] & col_mask[None, :]


def _x_operand(x, layout: UnitLayout, method: str, dtype, interleave_lanes: bool):
  """The kernel's ``x``: lane-major in ``dtype`` (dot), ``x`` in ``dtype`` (dot with
  interleaved lanes), else a free ``(M, units, L)`` view.

  The dot tiles load each lane as a contiguous ``(block_m, block_units)``
  tile from XLA's transpose, or (``interleave_lanes``) ``(block_m,
  block_units * L)`` tiles of ``x`` as it is; the fma tiles load the lanes
  strided from ``x`` itself, so no XLA op runs before the kernel (one fewer
  launch at decode sizes, where the whole matmul takes ~10 us).
  """
  if method == "dot":
    return x.astype(dtype) if interleave_lanes else x_lanes(x, layout).astype(dtype)
  m_rows, in_features = x.shape
  return x.reshape(m_rows, in_features // layout.codes, layout.codes)


def x_lanes(x, layout: UnitLayout):
  """``(M, in)`` -> ``(M, L, in / L)``: column ``u * L + j`` of ``x`` at ``[:, j, u]`` (XLA transpose)."""
  m_rows, in_features = x.shape
  n_lanes = layout.codes
  return jnp.swapaxes(x.reshape(m_rows, in_features // n_lanes, n_lanes), 1, 2)


def _matmul_input_grad_kernel(grad_y_ref, packed_ref, scale_ref, grad_x_ref, *, C, m_rows,
                              n_out, n_groups, block_m, block_n, block_groups, steps_per_split,
                              compute_dtype, precision, partial_sums, split_float32):
  """One ``(block_m, 4 * block_groups)`` tile of ``grad_x`` over one slab of ``out``.

  Each step scales a ``(block_m, block_n)`` chunk of ``grad_y`` by its rows'
  ``scale`` in float32, reads the ``(block_n, block_groups)`` codes (bytes)
  and meets each of the four code lanes in one dot (three with ``split_float32``:
  the float32 operand's bfloat16 pieces). ``partial_sums``: the slab's float32
  tile goes to ``grad_x_ref[split]`` and XLA adds the slabs. (``t`` from clamped
  adds, as the forward's, was 15-17% slower here at one row on an H200: session
  18, run 2.)
  """
  m0 = pl.program_id(0) * block_m
  g0 = pl.program_id(1) * block_groups
  first_out = pl.program_id(2) * (steps_per_split * block_n)
  m_mask = (m0 + _iota(block_m)) < m_rows
  group_mask = (g0 + _iota(block_groups)) < n_groups

  def step(i, accumulators):
    n0 = first_out + i * block_n
    n_mask = (n0 + _iota(block_n)) < n_out
    grad_y = plgpu.load(grad_y_ref.at[pl.ds(m0, block_m), pl.ds(n0, block_n)],
                        mask=m_mask[:, None] & n_mask[None, :], other=0)
    scale = _load_vector(scale_ref, n0, block_n, n_mask, 0.0).astype(_F32)
    scaled = grad_y.astype(_F32) * scale[None, :]
    if not split_float32:
      scaled = scaled.astype(compute_dtype)
    codes = _load_codes(packed_ref, n0, block_n, g0, block_groups,
                        n_mask[:, None] & group_mask[None, :])
    return tuple(
        acc + _dot_with_t(scaled, ref_lib.ternary_of(code, C).astype(_F32).astype(compute_dtype),
                          _DIMS_NN, split=split_float32, precision=precision)
        for acc, code in zip(accumulators, codes))

  zeros = jnp.zeros((block_m, block_groups), _F32)
  accumulators = _loop(steps_per_split, step, (zeros,) * 4)
  mask = m_mask[:, None] & group_mask[None, :]
  if partial_sums:
    for k, acc in enumerate(accumulators):
      plgpu.store(grad_x_ref.at[pl.program_id(2), pl.ds(m0, block_m), pl.ds(g0, block_groups),
                                _I32(k)], acc, mask=mask)
  else:
    _store_lanes(grad_x_ref, m0, block_m, g0, block_groups,
                 [acc.astype(grad_x_ref.dtype) for acc in accumulators], mask)


def _decoded_weight(packed, C: int, compute_dtype, interpret: bool):
  """``t`` in ``compute_dtype`` for XLA's GEMM (exact): the operand dtype (bfloat16 for a
  float32 operand split into pieces)."""
  return elementwise.ternary_decode(packed, jnp.ones((packed.shape[0],), _F32), C=C,
                                    dtype=compute_dtype, interpret=interpret)


def _matmul_config(config, shape, dtype, interpret: bool = False) -> MatmulConfig:
  if check_config(config, MatmulConfig) is None:
    wgmma = mosaic_gpu_matmul.unsupported_reason(*shape, dtype, interpret) is None
    return MatmulConfig.get_heuristics_config(shape, dtype, wgmma=wgmma)
  return config


def _wgmma_matmul(x, packed, scale, *, C: int, out_dtype, config: MatmulConfig,
                  interpret: bool):
  """The ``"wgmma"`` method (:mod:`.mosaic_gpu_matmul`), or a ValueError saying why not."""
  shape = (x.shape[0], packed.shape[0], x.shape[1])
  reason = (mosaic_gpu_matmul.unsupported_reason(*shape, x.dtype, interpret)
            or mosaic_gpu_matmul.config_reason(config, *shape[1:]))
  if reason:
    raise ValueError(f"MatmulConfig(method='wgmma') cannot run x {x.dtype.name}{list(x.shape)} "
                     f"@ packed uint8{list(packed.shape)}: {reason}")
  return mosaic_gpu_matmul.ternary_matmul(x, packed, scale, C=C, out_dtype=out_dtype,
                                          config=config)


def ternary_matmul(x, packed, scale, *, C: int, out_dtype, config: MatmulConfig | None = None,
                   interpret: bool = False):
  """``(M, in) @ (scale * t)^T -> (M, out)`` reading the packed codes in the kernel.

  ``config.method="decode"`` instead decodes ``t`` to a dense compute-dtype
  matrix (a Pallas kernel; exact) and lets XLA multiply: a temporary of
  ``out * in`` values, for large ``M`` where the GEMM dominates.
  """
  m_rows, in_features = x.shape
  out_features = packed.shape[0]
  config = _matmul_config(config, (m_rows, out_features, in_features), x.dtype, interpret)
  if config.method == "wgmma":
    return _wgmma_matmul(x, packed, scale, C=C, out_dtype=out_dtype, config=config,
                         interpret=interpret)
  compute_dtype, split, precision = _operand_setup(x.dtype, config)
  x_dtype = _F32 if split else compute_dtype  # split: bf16 pieces of float32 x
  if config.method == "decode":
    t = _decoded_weight(packed, C, compute_dtype, interpret)
    y = _xla_dot_with_t(x.astype(x_dtype), t, _DIMS_NT, split=split, precision=precision)
    return (y * scale.astype(_F32)[None, :]).astype(out_dtype)
  # A dot step contracts one code lane of block_units units (interleaved: all L lanes of
  # them): Triton dots need >= 16.
  interleave_lanes = config.method == "dot" and config.interleave_lanes
  min_word_groups = (4 * ref_lib.CODES_PER_WORD_GROUP
                     if config.method == "dot" and not interleave_lanes else 4)
  layout = unit_layout(in_features, config.word_loads and config.block_groups >= min_word_groups)
  per_unit = layout.codes
  n_units = in_features // per_unit
  block_units = max(1, config.block_groups * 4 // per_unit)
  steps_per_split, splits = _split_steps(_cdiv(n_units, block_units), config.split_k)
  partial_sums = splits > 1
  x_vector = 1
  if config.method == "fma" and config.x_vector_loads:  # 16-byte loads of consecutive lanes
    x_vector = min(per_unit, max(1, 16 // jnp.dtype(x.dtype).itemsize))
  kernel = functools.partial(
      _matmul_kernel, C=C, layout=layout, m_rows=m_rows, n_out=out_features, n_units=n_units,
      block_m=config.block_m, block_n=config.block_n, block_units=block_units,
      steps_per_split=steps_per_split, method=config.method, compute_dtype=compute_dtype,
      precision=precision, partial_sums=partial_sums, x_vector=x_vector,
      split_float32=split and config.method == "dot", interleave_lanes=interleave_lanes,
      weights_lhs=interleave_lanes and config.weights_lhs,
      register_prefetch=config.method == "dot" and config.register_prefetch,
      compiled=not interpret)
  if partial_sums:
    out_shape = jax.ShapeDtypeStruct((splits, m_rows, out_features), _F32)
  else:
    out_shape = jax.ShapeDtypeStruct((m_rows, out_features), out_dtype)
  y = _call(
      kernel, name="ternary_matmul",
      grid=(_cdiv(m_rows, config.block_m), _cdiv(out_features, config.block_n), splits),
      out_shape=out_shape, config=config, interpret=interpret,
  )(_x_operand(x, layout, config.method, x_dtype, interleave_lanes),
    packed_units(packed, layout), scale,
    ramp_bases())
  if partial_sums:
    y = (jnp.sum(y, axis=0) * scale.astype(_F32)[None, :]).astype(out_dtype)
  return y


def ternary_matmul_input_grad(grad_y, packed, scale, *, C: int, out_dtype,
                              config: MatmulConfig | None = None, interpret: bool = False):
  """``(grad_y * scale) @ t``: ``(M, out) -> (M, in)``, reading the packed codes.

  ``config`` tiles it as ``(M, in, out)`` (:meth:`MatmulConfig.get_input_grad_heuristics_config`
  when None or ``method`` is ``"fma"`` or ``"wgmma"``): dot tiles of ``grad_x`` with ``out`` split
  into ``split_k`` slabs, or ``method="decode"`` (``t`` decoded, then XLA's
  GEMM). ``grad_y * scale`` is formed in float32 and then rounded to the
  compute dtype (16-bit ``grad_y``) or split into bfloat16 pieces (float32).
  """
  m_rows, out_features = grad_y.shape
  in_features = 4 * (packed.shape[1] // 3)
  shape = (m_rows, in_features, out_features)
  if check_config(config, MatmulConfig) is None or config.method in ("fma", "wgmma"):
    config = MatmulConfig.get_input_grad_heuristics_config(shape, grad_y.dtype)
  compute_dtype, split, precision = _operand_setup(grad_y.dtype, config)
  if config.method == "decode":
    scaled = grad_y.astype(_F32) * scale.astype(_F32)[None, :]
    t = _decoded_weight(packed, C, compute_dtype, interpret)
    grad_x = _xla_dot_with_t(scaled if split else scaled.astype(compute_dtype), t, _DIMS_NN,
                             split=split, precision=precision)
    return grad_x.astype(out_dtype)
  n_groups = in_features // 4
  steps_per_split, splits = _split_steps(_cdiv(out_features, config.block_n), config.split_k)
  partial_sums = splits > 1
  kernel = functools.partial(
      _matmul_input_grad_kernel, C=C, m_rows=m_rows, n_out=out_features, n_groups=n_groups,
      block_m=config.block_m, block_n=config.block_n, block_groups=config.block_groups,
      steps_per_split=steps_per_split, compute_dtype=compute_dtype, precision=precision,
      partial_sums=partial_sums, split_float32=split)
  if partial_sums:
    out_shape = jax.ShapeDtypeStruct((splits, m_rows, n_groups, 4), _F32)
  else:
    out_shape = jax.ShapeDtypeStruct((m_rows, n_groups, 4), out_dtype)
  grad_x = _call(
      kernel, name="ternary_matmul_input_grad",
      grid=(_cdiv(m_rows, config.block_m), _cdiv(n_groups, config.block_groups), splits),
      out_shape=out_shape, config=config, interpret=interpret,
  )(grad_y, _packed_view(packed), scale)
  if partial_sums:
    grad_x = jnp.sum(grad_x, axis=0).astype(out_dtype)
  return grad_x.reshape(m_rows, in_features)
