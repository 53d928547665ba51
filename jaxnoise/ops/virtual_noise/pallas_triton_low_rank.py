"""Pallas kernel (GPU Triton backend) of the low-rank perturbed linear.

Individual ``i``'s perturbation of an ``(out, in)`` block is
``A_i B_i^T / sqrt(r)``. The factor vectors ``a_c = A_i[:, c]`` and
``b_c = B_i[:, c]`` are the two halves of row ``c`` of an ``(r, out + in)``
block (:mod:`jaxnoise.noise`, "Low-rank layout"), so each is a contiguous run
of indices that one row start and a 32-bit delta address, with the noise
tiles of :mod:`jaxnoise.ops.virtual_noise.pallas_triton`. One kernel serves
the forward and the input gradient: it contracts an operand ``v_i`` with the
factor vectors of the "reduced" side, then emits ``sum_c (v_i . f_c) g_c``
over the other side, one broadcast multiply-add per component and element
(``r`` is small, so no matrix unit is needed)::

    forward          v = x,        reduced b_c (in),  emitted a_c (out)
    input gradient   v = grad_out, reduced a_c (out), emitted b_c (in)

The weight-gradient estimate is a GEMM over ``pop * r`` on factors that XLA
materialises (:func:`low_rank_gradient` says why), by a tile kernel whose
summation order does not depend on the number of rows (:func:`tile_products`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _pallas
from jaxnoise.ops.virtual_noise import config as config_lib
from jaxnoise.ops.virtual_noise import mosaic_gpu_low_rank
from jaxnoise.ops.virtual_noise import reference
from jaxnoise.ops.virtual_noise.pallas_triton import NoiseLayout
from jaxnoise.ops.virtual_noise.pallas_triton import _RowStart
from jaxnoise.ops.virtual_noise.pallas_triton import _noise_factor
from jaxnoise.ops.virtual_noise.pallas_triton import _row_start
from jaxnoise.ops.virtual_noise.pallas_triton import _stream_keys
from jaxnoise.ops.virtual_noise.pallas_triton import _vector_noise
from jaxnoise.ops.virtual_noise.pallas_triton import _words

_U32 = jnp.uint32
_F32 = jnp.float32


def _factor_layouts(kind: noise_lib.NoiseKind, offset: int, out_features: int,
                    in_features: int, rank: int) -> tuple[NoiseLayout, NoiseLayout]:
  """Layouts of the ``A`` and ``B`` factor vectors: rows ``c``, a row stride of ``out + in``."""
  width = out_features + in_features
  return (NoiseLayout.of_block(kind, offset, rank, width),
          NoiseLayout.of_block(kind, offset + out_features, rank, width))


def _factor_run(layout: NoiseLayout, keys, start: _RowStart, col0, n: int) -> jax.Array:
  """Integer-valued ``q`` of elements ``[col0, col0 + n)`` of one factor vector, ``(1, n)``.

  ``start`` is the vector's row start (``(1, 1)`` arrays). Kinds with 32
  values per word hash each of the run's words once as a ``(n / 32, 1)``
  column, spread its bits over ``(n / 32, 32)`` and reshape to ``(1, n)``
  (``col0`` and ``n`` are multiples of 32); a row that does not start on a
  word boundary funnel-shifts each word with the next one.
  """
  col0 = col0.astype(_U32) if hasattr(col0, "astype") else _U32(col0)
  kind = layout.kind
  if kind.values_per_word == 1:
    delta = col0 + jax.lax.broadcasted_iota(_U32, (1, n), 1)
    return kind.unscaled(_words(layout, keys, start, delta))
  n_words = n // 32
  word_delta = (col0 >> _U32(5)) + jax.lax.broadcasted_iota(_U32, (n_words, 1), 0)
  words = _words(layout, keys, start, word_delta)
  if not layout.aligned:
    following = _words(layout, keys, start, word_delta + _U32(1))
    lead = start.lane
    funnel = (words >> lead) | (following << (_U32(32) - lead))
    words = jnp.where(lead == _U32(0), words, funnel)
  lanes = jax.lax.broadcasted_iota(_U32, (1, 32), 1)
  bits = ((words >> lanes) & _U32(1)).astype(jnp.int32)
  return (1 - 2 * bits).astype(_F32).reshape(1, n)


def _component_streams(layout: NoiseLayout, seed, rank: int):
  """Row starts and stream keys of the ``rank`` factor vectors of one side."""
  starts = [_row_start(layout, jnp.full((1, 1), c, _U32)) for c in range(rank)]
  if not layout.high_word:
    keys = _stream_keys(layout, seed, starts[0])
    return starts, [keys] * rank
  return starts, [_stream_keys(layout, seed, start) for start in starts]


def _reduce_factor_dots(v_ref, seed, *, reduce_layout: NoiseLayout, rank: int, shared_v: bool,
                        n_inputs: int, first, batch0, batch_ok, n_reduce: int,
                        config: config_lib.LowRankLinearConfig):
  """``v_i . q(f_c)`` for the program's inputs and components: ``(block_batch, 1)`` each.

  Ordered member-major (``[member * rank + c]``); ``q`` is unscaled.
  """
  block_batch, block_reduce = config.block_batch, config.block_reduce
  starts, keys = _component_streams(reduce_layout, seed, rank)

  def body(step, accs):
    col0 = step * block_reduce
    cols_ok = (col0 + jax.lax.iota(jnp.int32, block_reduce))[None, :] < n_reduce
    tiles = []
    for member in range(n_inputs):
      index = (pl.ds(batch0, block_batch), pl.ds(col0, block_reduce))
      ref = v_ref.at[index] if shared_v else v_ref.at[(first + member,) + index]
      tiles.append(_pallas.load(ref, mask=batch_ok & cols_ok, other=0).astype(_F32))
    new = list(accs)
    for c in range(rank):
      factor_q = _factor_run(reduce_layout, keys[c], starts[c], col0, block_reduce)
      for member in range(n_inputs):
        new[member * rank + c] += jnp.sum(tiles[member] * factor_q, axis=1, keepdims=True)
    return tuple(new)

  zeros = tuple(jnp.zeros((block_batch, 1), _F32) for _ in range(n_inputs * rank))
  return jax.lax.fori_loop(0, pl.cdiv(n_reduce, block_reduce), body, zeros)


def _term_factor(sigma_ref, kind: noise_lib.NoiseKind, rank: int) -> jax.Array:
  """``sigma scale^2 / sqrt(r)``.

  Each factor carries the kind's scale; 1 / sqrt(r) keeps unit variance.
  """
  return sigma_ref[0] * _F32(kind.scale * kind.scale / (rank ** 0.5))


def _low_rank_kernel(v_ref, base_ref, bias_ref, seeds_ref, sigma_ref, out_ref, *,
                     reduce_layout: NoiseLayout, emit_layout: NoiseLayout, rank: int,
                     shared_v: bool, antithetic: bool, batch: int, n_reduce: int, n_emit: int,
                     bias_offset: int | None, config: config_lib.LowRankLinearConfig):
  block_batch = config.block_batch
  block_emit = config.block_emit
  kind = reduce_layout.kind
  pair = 2 if antithetic else 1
  n_inputs = 1 if shared_v else pair
  first = pl.program_id(0) * pair
  batch0 = pl.program_id(1) * block_batch
  seed = seeds_ref[first]
  batch_ok = (batch0 + jax.lax.iota(jnp.int32, block_batch))[:, None] < batch
  accs = _reduce_factor_dots(v_ref, seed, reduce_layout=reduce_layout, rank=rank,
                             shared_v=shared_v, n_inputs=n_inputs, first=first, batch0=batch0,
                             batch_ok=batch_ok, n_reduce=n_reduce, config=config)
  emit_starts, emit_keys = _component_streams(emit_layout, seed, rank)
  factor = _term_factor(sigma_ref, kind, rank)

  def emit_body(step, carry):
    col0 = step * block_emit
    cols = col0 + jax.lax.iota(jnp.int32, block_emit)
    out_ok = batch_ok & (cols[None, :] < n_emit)
    terms = [jnp.zeros((block_batch, block_emit), _F32) for _ in range(n_inputs)]
    for c in range(rank):
      factor_q = _factor_run(emit_layout, emit_keys[c], emit_starts[c], col0, block_emit)
      for member in range(n_inputs):
        terms[member] = terms[member] + accs[member * rank + c] * factor_q
    bias_noise = 0.0
    if bias_offset is not None:
      bias_noise = sigma_ref[0] * _F32(kind.scale) * _vector_noise(
          kind, seed, bias_offset, cols, n_emit)[None, :]
    offset_term = 0.0
    if bias_ref is not None:
      offset_term = _pallas.load(bias_ref.at[pl.ds(col0, block_emit)],
                                 mask=cols < n_emit, other=0)[None, :]
    index = (pl.ds(batch0, block_batch), pl.ds(col0, block_emit))
    bases = [0.0] * pair
    if base_ref is not None and len(base_ref.shape) == 2:
      bases = [_pallas.load(base_ref.at[index], mask=out_ok, other=0)] * pair
    elif base_ref is not None:
      bases = [_pallas.load(base_ref.at[(first + member,) + index], mask=out_ok, other=0)
               for member in range(pair)]
    for member in range(pair):
      sign = 1.0 - 2.0 * member
      value = (offset_term + bases[member]
               + sign * (factor * terms[member % n_inputs] + bias_noise))
      index = (first + member, pl.ds(batch0, block_batch), pl.ds(col0, block_emit))
      _pallas.store(out_ref.at[index], value.astype(out_ref.dtype), mask=out_ok)
    return carry

  jax.lax.fori_loop(0, pl.cdiv(n_emit, block_emit), emit_body, 0)


def _low_rank_term(v, seeds, sigma, *, base, bias, reduce_layout, emit_layout, rank, antithetic,
                   n_emit, bias_offset, out_dtype, config, interpret, name):
  """``(pop, batch, n_emit)``: ``base + bias + sigma s_i [(v_i F_i) G_i^T / sqrt(r) + noise]``.

  ``base`` is None, ``(batch, n_emit)`` (shared) or ``(pop, batch, n_emit)``.
  """
  pop = seeds.shape[0]
  shared_v = v.ndim == 2
  batch, n_reduce = v.shape[-2:]
  kernel = functools.partial(
      _low_rank_kernel, reduce_layout=reduce_layout, emit_layout=emit_layout, rank=rank,
      shared_v=shared_v, antithetic=antithetic, batch=batch, n_reduce=n_reduce, n_emit=n_emit,
      bias_offset=bias_offset, config=config)
  operands = [v, base, bias, seeds, jnp.reshape(sigma, (1,)).astype(_F32)]
  present = [operand is not None for operand in operands]

  def body(*refs):
    refs = iter(refs)
    args = [next(refs) if here else None for here in present]
    kernel(*args, next(refs))

  call = _pallas.pallas_call(
      body,
      out_shape=jax.ShapeDtypeStruct((pop, batch, n_emit), out_dtype),
      grid=(pop // 2 if antithetic else pop, pl.cdiv(batch, config.block_batch)),
      interpret=interpret,
      compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
      name=name,
  )
  return call(*[operand for operand in operands if operand is not None])


def _fused_operands_kernel(x_ref, seeds_ref, sigma_ref, keys_ref, coef_ref, bias_coef_ref, *,
                           reduce_layout: NoiseLayout, rank: int, rows: int, n_reduce: int,
                           word_hi: int, config: config_lib.LowRankLinearConfig):
  pair = pl.program_id(0)
  block_batch = config.block_batch
  batch0 = pl.program_id(1) * block_batch
  seed = seeds_ref[2 * pair]
  tokens = batch0 + jax.lax.iota(jnp.int32, block_batch)
  accs = _reduce_factor_dots(x_ref, seed, reduce_layout=reduce_layout, rank=rank,
                             shared_v=False, n_inputs=2, first=2 * pair, batch0=batch0,
                             batch_ok=(tokens < rows)[:, None], n_reduce=n_reduce,
                             config=config)
  kind = reduce_layout.kind
  noise_scale = _noise_factor(sigma_ref, kind)
  factor = _term_factor(sigma_ref, kind, rank)
  # Row ``pair * rows + token`` of every output: the pair's member rows, in order.
  at = pl.ds(pair * rows + batch0, block_batch)
  mask = None if rows % block_batch == 0 else tokens < rows
  store = lambda ref, lead, value: _pallas.store(ref.at[lead + (at,)], value, mask=mask)
  for sign in range(2):
    flip = _F32(1.0 - 2.0 * sign)
    for c in range(rank):
      store(coef_ref, (jnp.int32(c), jnp.int32(sign)),
            (flip * factor) * jnp.sum(accs[sign * rank + c], axis=1))
    store(bias_coef_ref, (jnp.int32(sign),), jnp.full((block_batch,), flip * noise_scale))
  multiplier, increment = noise_lib.stream_keys(seed, _U32(word_hi))
  store(keys_ref, (jnp.int32(0),), jnp.full((block_batch,), multiplier, _U32))
  store(keys_ref, (jnp.int32(1),), jnp.full((block_batch,), increment, _U32))


def fused_gemm_operands(x, seeds, sigma, *, reduce_layout: NoiseLayout, rank: int, word_hi: int,
                        config: config_lib.LowRankLinearConfig, interpret: bool = False):
  """Per-row operands of the fused Mosaic GPU forward, from the reduce phase of this kernel.

  ``x`` is ``(pop, rows, in)`` with antithetic pairs. Program ``(j, t)``
  contracts ``config.block_batch`` rows of both members of pair ``j`` (one
  row when ``rows == 1``) with the pair's ``B`` factor vectors and writes
  rows ``j * rows + token`` (pair-major, then the member's rows) of:

  * ``keys``: uint32 ``(2, pop / 2 * rows)``, the stream multiplier and
    increment of the pair's seed at high word ``word_hi``
    (:func:`jaxnoise.noise.stream_keys`), the same on each of a pair's rows;
  * ``coef``: float32 ``(r, 2, pop / 2 * rows)``,
    ``s sigma scale^2 / sqrt(r) * (x_i[row] . q(B_c))`` for the ``+`` and ``-`` member;
  * ``bias_coef``: float32 ``(2, pop / 2 * rows)``, ``s sigma scale``.

  No XLA work is left between this kernel and the GEMM.
  """
  pop, rows, n_reduce = x.shape
  n_pairs = pop // 2
  if rows == 1:
    config = dataclasses.replace(config, block_batch=1)
  kernel = functools.partial(_fused_operands_kernel, reduce_layout=reduce_layout, rank=rank,
                             rows=rows, n_reduce=n_reduce, word_hi=word_hi, config=config)
  n_rows = n_pairs * rows
  return _pallas.pallas_call(
      kernel,
      out_shape=(jax.ShapeDtypeStruct((2, n_rows), _U32),
                 jax.ShapeDtypeStruct((rank, 2, n_rows), _F32),
                 jax.ShapeDtypeStruct((2, n_rows), _F32)),
      grid=(n_pairs, pl.cdiv(rows, config.block_batch)),
      interpret=interpret,
      compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
      name="virtual_low_rank_fused_operands",
  )(x, seeds, jnp.reshape(sigma, (1,)).astype(_F32))


def _low_rank_config(config, batch: int, n_reduce: int, n_emit: int, rank: int,
                     kind: noise_lib.NoiseKind):
  if config is None:
    return config_lib.low_rank_linear_heuristics(batch, n_reduce, n_emit, rank,
                                                 kind.name).validate()
  if not isinstance(config, config_lib.LowRankLinearConfig):
    raise TypeError(f"config of a low-rank op must be a LowRankLinearConfig or None, got "
                    f"{type(config).__name__}")
  return config.validate()


def low_rank_perturbed_linear(x, weight, bias, seeds, sigma, offset, *, kind, antithetic,
                              out_dtype, rank, config=None, interpret=False):
  """Kernel path of :func:`jaxnoise.virtual_perturbed_linear` with ``rank`` (validated).

  The unperturbed GEMM ``x W^T`` is XLA's. With shared x the kernel adds its
  ``(batch, out)`` result to every individual; with per-individual x the
  kernel writes the noise term (bias included) and XLA adds it to the GEMM
  output (which it can fuse into the GEMM's epilogue), or, with
  ``config.fuse_base``, the kernel reads the GEMM's output and writes the sum.
  On a Hopper GPU, calls that :func:`mosaic_gpu_low_rank.unsupported_reason`
  accepts run :func:`fused_gemm_operands` and then one Mosaic GPU GEMM with
  the noise in its epilogue instead.
  """
  out_features, in_features = weight.shape
  batch = x.shape[-2]
  config = _low_rank_config(config, batch, in_features, out_features, rank, kind)
  bias_offset = offset + noise_lib.noise_block_size(weight.shape, rank)
  if config.materialize or rank > config_lib.MAX_KERNEL_RANK:
      return reference.perturbed_linear_reference(
        x, weight, bias, seeds, sigma, offset, kind=kind, antithetic=antithetic,
        out_dtype=out_dtype, rank=rank, precision=None)
  a_layout, b_layout = _factor_layouts(kind, offset, out_features, in_features, rank)
  n_indices = noise_lib.noise_block_size(weight.shape, rank) + (0 if bias is None else out_features)
  if mosaic_gpu_low_rank.unsupported_reason(x.shape, x.dtype, out_features, offset, n_indices,
                                            rank, antithetic, out_dtype, config,
                                            interpret) is None:
    if config.gemm_member_dots and mosaic_gpu_low_rank.member_dots_supported(kind, rank,
                                                                             x.shape[1]):
      operands = mosaic_gpu_low_rank.member_dot_operands(
          seeds, sigma, kind=kind, offset=offset, weight_shape=weight.shape, rank=rank,
          dtype=x.dtype)
    else:
      operands = fused_gemm_operands(x, seeds, sigma, reduce_layout=b_layout, rank=rank,
                                     word_hi=mosaic_gpu_low_rank.word_hi(kind, offset),
                                     config=config, interpret=interpret)
    return mosaic_gpu_low_rank.fused_forward(x, weight, bias, offset, operands, kind=kind,
                                             rank=rank, out_dtype=out_dtype, config=config)
  # A 16-bit output takes 16-bit partial results: XLA's GEMM writes that dtype anyway.
  term_dtype = out_dtype if jnp.dtype(out_dtype).itemsize == 2 else _F32
  w = weight.astype(x.dtype) if x.dtype != weight.dtype else weight
  base = jnp.einsum("...bk,ok->...bo", x, w, preferred_element_type=term_dtype)
  bias32 = None if bias is None else bias.astype(_F32)
  common = dict(reduce_layout=b_layout, emit_layout=a_layout, rank=rank, antithetic=antithetic,
                n_emit=out_features, bias_offset=None if bias is None else bias_offset,
                config=config, interpret=interpret, name="virtual_low_rank_linear")
  if x.ndim == 2 or config.fuse_base:
    return _low_rank_term(x, seeds, sigma, base=base, bias=bias32, out_dtype=out_dtype,
                          **common)
  term = _low_rank_term(x, seeds, sigma, base=None, bias=bias32, out_dtype=term_dtype, **common)
  return (base + term).astype(out_dtype)


def low_rank_input_grad(grad_out, weight, seeds, sigma, offset, *, kind, antithetic, shared_x,
                        rank, config=None, interpret=False):
  """``dX[i] = G[i] (W + sigma s_i A_i B_i^T / sqrt(r))``, summed over ``i`` for shared x.

  Per-individual x runs the low-rank kernel with the roles of the factors
  swapped; shared x sums over the population, a GEMM over ``pop * r`` that
  XLA does from materialised factors (chunked).
  """
  _, batch, out_features = grad_out.shape
  in_features = weight.shape[1]
  config = _low_rank_config(config, batch, out_features, in_features, rank, kind)
  if shared_x or config.materialize or rank > config_lib.MAX_KERNEL_RANK:
    return reference.perturbed_linear_input_grad_reference(
        grad_out, weight, seeds, sigma, offset, kind=kind, antithetic=antithetic,
        shared_x=shared_x, rank=rank, precision=None)
  a_layout, b_layout = _factor_layouts(kind, offset, out_features, in_features, rank)
  grad_out = grad_out.astype(_F32)
  base = jnp.einsum("pbo,ok->pbk", grad_out, weight.astype(_F32))
  term = _low_rank_term(grad_out, seeds, sigma, base=None, bias=None, reduce_layout=a_layout,
                        emit_layout=b_layout, rank=rank, antithetic=antithetic,
                        n_emit=in_features, bias_offset=None, out_dtype=_F32, config=config,
                        interpret=interpret, name="virtual_low_rank_input_grad")
  return base + term


# a (rows, k) . b (cols, k) contracted over k -> (rows, cols): both operands K-major,
# the one layout Hopper's wgmma takes for 32-bit (TF32) operands without a transpose.
_DIMS_NT = (((1,), (1,)), ((), ()))
# Individuals per contraction are a multiple of this (zero-weight padding).
_K_ALIGN = 64


def _tile_products_kernel(a_ref, b_ref, *refs, n_k: int, n_rows: int, n_cols: int,
                          config: config_lib.LowRankGradientConfig, precision, update: bool,
                          running: bool, split: tuple[int, int] | None = None):
  """One ``(block_rows, block_cols)`` tile of ``a b^T``, summed over ``k`` in ``block_k`` steps.

  The steps are the same for every tile (masked loads add exact zeros past the
  ends), so an element's value does not depend on where its tile lies.
  ``split=(parts, steps)``: the contraction is split in ``parts`` of ``steps``
  steps each (the last one masked past ``n_k``), part ``program_id(2)`` here,
  stored as ``out_ref[part]`` (float32; no running sum or update).
  ``running``: ``refs`` start with ``total_ref`` (float32), and the tile is
  ``total + acc`` (one float32 addition, as XLA's ``total + a b^T``).
  ``update``: ``refs`` then hold ``(step_ref, weight_ref)`` and the tile stored
  is ``weight + step * acc`` in float32, rounded once to the weight's dtype
  (the output aliases ``weight``). ``out_ref`` comes last.
  """
  refs = list(refs)
  total_ref = refs.pop(0) if running else None
  step_ref, weight_ref = (refs.pop(0), refs.pop(0)) if update else (None, None)
  (out_ref,) = refs
  block_rows, block_cols, block_k = config.block_rows, config.block_cols, config.block_k
  row0 = pl.program_id(0) * block_rows
  col0 = pl.program_id(1) * block_cols
  n_parts, n_steps = (1, pl.cdiv(n_k, block_k)) if split is None else split
  step0 = 0 if split is None else pl.program_id(2) * n_steps
  # Masks only where a dimension is ragged (static): unmasked loads vectorise fully.
  rows_ok = (row0 + jax.lax.iota(jnp.int32, block_rows)) < n_rows
  cols_ok = (col0 + jax.lax.iota(jnp.int32, block_cols)) < n_cols
  ragged_rows, ragged_cols = n_rows % block_rows, n_cols % block_cols
  ragged_k = n_k != n_parts * n_steps * block_k

  def load(ref, start, size, ok, k0, k_ok):
    window = ref.at[pl.ds(start, size), pl.ds(k0, block_k)]
    masks = ([] if ok is None else [ok[:, None]]) + ([] if k_ok is None else [k_ok[None, :]])
    if not masks:
      return _pallas.load(window)
    mask = masks[0] if len(masks) == 1 else masks[0] & masks[1]
    return _pallas.load(window, mask=jnp.broadcast_to(mask, (size, block_k)), other=0)

  def step(index, acc):
    k0 = (step0 + index) * block_k
    k_ok = (k0 + jax.lax.iota(jnp.int32, block_k)) < n_k if ragged_k else None
    a = load(a_ref, row0, block_rows, rows_ok if ragged_rows else None, k0, k_ok)
    b = load(b_ref, col0, block_cols, cols_ok if ragged_cols else None, k0, k_ok)
    return acc + jax.lax.dot_general(a, b, _DIMS_NT, precision=precision,
                                     preferred_element_type=_F32)

  acc = jax.lax.fori_loop(0, n_steps, step, jnp.zeros((block_rows, block_cols), _F32))
  tile = (pl.ds(row0, block_rows), pl.ds(col0, block_cols))
  mask = rows_ok[:, None] & cols_ok[None, :] if ragged_rows or ragged_cols else None
  if split is not None:  # this part's partial tile, float32
    part_tile = (pl.ds(pl.program_id(2), 1),) + tile
    if mask is None:
      _pallas.store(out_ref.at[part_tile], acc[None])
    else:
      _pallas.store(out_ref.at[part_tile], acc[None], mask=mask[None])
    return
  if running:
    acc = (_pallas.load(total_ref.at[tile]) if mask is None
           else _pallas.load(total_ref.at[tile], mask=mask, other=0)) + acc
  if update:
    weight = (_pallas.load(weight_ref.at[tile]) if mask is None
              else _pallas.load(weight_ref.at[tile], mask=mask, other=0))
    acc = weight.astype(_F32) + step_ref[0] * acc
  acc = acc.astype(out_ref.dtype)
  if mask is None:
    _pallas.store(out_ref.at[tile], acc)
  else:
    _pallas.store(out_ref.at[tile], acc, mask=mask)


def _tile_precision(a, config: config_lib.LowRankGradientConfig):
  exact = a.dtype == _F32 and not config.tf32
  return jax.lax.Precision.HIGHEST if exact else None


def _ending_in_xla(product, total, update, out_dtype):
  """What the tiles' epilogue does after a contraction, in XLA: ``total + product``, then
  the step (``update``) or the rounding to ``out_dtype``."""
  summed = product if total is None else total + product
  if update is not None:
    weight, step = update
    return (weight.astype(_F32) + step[0] * summed).astype(weight.dtype)
  return summed.astype(out_dtype)


def tile_products(a, b, *, config: config_lib.LowRankGradientConfig, interpret=False,
                  update=None, out_dtype=_F32, total=None):
  """``a b^T`` for ``a`` ``(rows, k)`` and ``b`` ``(cols, k)``, tile by tile.

  Row tiles start at multiples of ``config.block_rows`` of ``a``'s rows. Each
  tile sums in float32 and rounds once to ``out_dtype`` as it stores (with
  ``update``, to the weight's dtype: ``out_dtype`` is not used).
  ``total`` (float32 ``(rows, cols)``, a running sum over earlier
  contractions): each tile adds its products to it first, one float32
  addition per element as XLA's ``total + a b^T`` would make, so a sum over
  chunks needs no pass of its own (the output aliases ``total`` where both
  are float32); with ``update`` the tile is ``weight + step * (total + a
  b^T)``. A contraction of one ``block_k`` step leaves the addition to XLA.
  ``config.split_k`` > 1 splits the contraction: each part's tiles store
  float32 partial sums, which XLA adds in order and then treats as one
  contraction's product (the running sum, the rounding, the step).
  ``update=(weight, step)`` (``weight`` ``(rows, cols)``, ``step`` a float32
  ``(1,)``) returns ``weight + step * a b^T`` instead, formed in float32 in
  each tile's epilogue and rounded once to ``weight``'s dtype; the output
  aliases ``weight`` (in place where the caller donates it), so the product
  is never stored.
  """
  n_rows, n_k = a.shape
  n_cols = b.shape[0]
  steps = pl.cdiv(n_k, config.block_k)
  part_steps = pl.cdiv(steps, config.split_k or 1)
  splits = pl.cdiv(steps, part_steps)  # no part wholly past n_k
  if splits > 1:
    # Parts of equal steps (the last may be masked past n_k), summed in order by XLA, which
    # then adds the running sum or the step as it would after one contraction.
    parts = _pallas.pallas_call(
        functools.partial(_tile_products_kernel, n_k=n_k, n_rows=n_rows, n_cols=n_cols,
                          config=config, update=False, running=False,
                          split=(splits, part_steps), precision=_tile_precision(a, config)),
        out_shape=jax.ShapeDtypeStruct((splits, n_rows, n_cols), _F32),
        grid=(pl.cdiv(n_rows, config.block_rows), pl.cdiv(n_cols, config.block_cols), splits),
        interpret=interpret,
        compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
        name="virtual_low_rank_gradient_split",
    )(a, b)
    product = parts[0]
    for part in range(1, splits):
      product = product + parts[part]
    return _ending_in_xla(product, total, update, out_dtype)
  if total is not None and n_k <= config.block_k:
    # One k-step: Triton may inline the loop and fold ``total + dot`` into the dot's
    # accumulator (another rounding), so XLA adds the running sum here (the same bits).
    return _ending_in_xla(tile_products(a, b, config=config, interpret=interpret), total,
                          update, out_dtype)
  kernel = functools.partial(_tile_products_kernel, n_k=n_k, n_rows=n_rows, n_cols=n_cols,
                             config=config, update=update is not None,
                             running=total is not None, precision=_tile_precision(a, config))
  operands, aliases = [a, b], {}
  if total is not None:
    operands.append(total)
  if update is not None:
    weight, step = update
    operands += [step, weight]
    out_dtype, aliases = weight.dtype, {len(operands) - 1: 0}
  elif total is not None and jnp.dtype(out_dtype) == _F32:
    aliases = {2: 0}
  return _pallas.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((n_rows, n_cols), out_dtype),
      grid=(pl.cdiv(n_rows, config.block_rows), pl.cdiv(n_cols, config.block_cols)),
      input_output_aliases=aliases,
      interpret=interpret,
      compiler_params=_pallas.compiler_params(config.num_warps, config.num_stages),
      name="virtual_low_rank_update" if update is not None else "virtual_low_rank_gradient",
  )(*operands)


def tile_window(n_rows: int, rows: tuple[int, int] | None, block_rows: int) -> tuple[int, int]:
  """``(lo, hi)``: the rows of the whole ``block_rows`` tiles that cover ``rows``.

  Tiles start at multiples of ``block_rows`` of the whole ``n_rows`` (the last
  one is cut at ``n_rows``), so a shard of rows is formed by the very tiles
  that form those rows on one device.

  Example:
    >>> tile_window(1000, (500, 500), 64)
    (448, 1000)
    >>> tile_window(1000, None, 64)
    (0, 1000)
  """
  row0, count = (0, n_rows) if rows is None else rows
  lo = row0 // block_rows * block_rows
  return lo, min(-(-(row0 + count) // block_rows) * block_rows, n_rows)


def _sum_over_chunks(contract, weights, seeds, chunk: int):
  """``contract``'s running sum over the chunks of ``(weights, seeds)``, in order.

  ``contract(w_c, seed_c, total, last)`` returns ``total + a_c b_c^T`` (``total``
  None for the first chunk; ``last`` for the final one, whose contraction may
  round or apply a step as it stores). The population is padded with zero
  weights to whole chunks (exact zeros in the sums). The first and last chunks
  are outside the loop over the others, so nothing initialises the sum and
  what follows the last contraction can be done in its epilogue.
  """
  n = weights.shape[0]
  n_chunks = -(-n // chunk)
  pad = n_chunks * chunk - n
  weights = jnp.pad(weights, (0, pad)).reshape(n_chunks, chunk)
  seeds = jnp.pad(seeds, (0, pad)).reshape(n_chunks, chunk)
  if n_chunks == 1:
    return contract(weights[0], seeds[0], None, True)
  total = contract(weights[0], seeds[0], None, False)

  def add_chunk(total, chunk_args):
    return contract(*chunk_args, total, False), None

  total, _ = jax.lax.scan(add_chunk, total, (weights[1:-1], seeds[1:-1]))
  return contract(weights[-1], seeds[-1], total, True)


def low_rank_gradient(fitness, seeds, shape, sigma, pop_size, offset, *, kind, antithetic, rank,
                      config=None, interpret=False, rows=None, update=None,
                      out_dtype=_F32):
  """GPU path of the low-rank weight-gradient estimate: factors, then :func:`tile_products`.

  A Pallas GEMM that generated the factors per output tile would hash each
  factor value once per tile of the other side: with 128-wide tiles that is
  ``pop * r * out * in / 64`` hashes against ``2 * pop * r * out * in`` GEMM
  flops, several times the GEMM's own time on an H200. So XLA materialises
  ``a = w q_A`` ``(out, chunk * r)`` and ``b = q_B`` ``(in, chunk * r)``
  (K-major; the integer-valued factors, hashed once; ``w`` the folded fitness
  times the scales) a chunk of the population at a time, ``chunk`` a multiple
  of ``_K_ALIGN`` (zero-weight padding), and the kernel contracts them
  over whole tiles whose summation order is fixed by ``config``
  (``config.xla_gemm``: one XLA GEMM per chunk instead). ``rows=(row0, n)``
  forms only those rows (:mod:`jaxnoise.parallel`) from the tiles that cover
  them (:func:`tile_window`), so they equal those rows of the whole gradient.

  ``update=(weight, step)`` (``step`` a float32 scalar) returns ``weight +
  step * gradient`` in ``weight``'s dtype, formed in float32 and rounded
  once; otherwise the float32 estimate is rounded once to ``out_dtype``.
  Where the tiles contract (not ``xla_gemm``) the last chunk's tiles do either
  in their epilogue, and each later chunk's tiles add to the earlier chunks'
  float32 sum in theirs (:func:`_sum_over_chunks`): with one chunk the
  gradient is never stored (the weight is read and written once), with more
  only the running float32 sum is, and no XLA pass sums, converts or adds it.
  XLA's GEMMs (``xla_gemm``) are chunked the same way, so XLA may fuse the
  running sum, and what follows the last one, into them.
  """
  if update is not None and rows is not None:
    raise ValueError("update and rows cannot be combined: update a shard with its own rows")
  if config is None:
    config = config_lib.LowRankGradientConfig()
  if not isinstance(config, config_lib.LowRankGradientConfig):
    raise TypeError(f"config of a low-rank gradient must be a LowRankGradientConfig or None, "
                    f"got {type(config).__name__}")
  config = config.validate()
  out_features, in_features = shape
  width = out_features + in_features
  row0, n_rows = (0, out_features) if rows is None else rows
  lo, hi = tile_window(out_features, rows, 1 if config.xla_gemm else config.block_rows)
  weights, pair_seeds = reference.scaled_weights(fitness, seeds, antithetic, sigma, pop_size,
                                                 kind.scale * kind.scale / rank ** 0.5,
                                                 apart=interpret)
  n = pair_seeds.shape[0]
  # Whole multiples of _K_ALIGN individuals per contraction: the operands' rows
  # (chunk * r long) stay 16-byte aligned and the kernel's steps need no mask.
  # Padded individuals weigh zero, so they add exact zeros.
  chunk = min(reference.chunk_size_for(n, width * rank, config.chunk), n)
  chunk = (-(-chunk // _K_ALIGN) * _K_ALIGN if chunk == n
           else max(_K_ALIGN, chunk // _K_ALIGN * _K_ALIGN))
  # Parts of the contraction from the whole layer's shape (a shard's rows split alike).
  config = dataclasses.replace(
      config, split_k=config.splits_for(out_features, in_features, chunk * rank))
  operand_dtype = jnp.dtype(config.operand_dtype)
  high = not noise_lib.fits_32_bits(kind, offset, rank * width)
  iota = lambda start, count: start + jax.lax.broadcasted_iota(_U32, (1, count), 1)
  a_hi, a_lo = noise_lib.block_index(offset, (rank, width), cols=iota(lo, hi - lo))
  b_hi, b_lo = noise_lib.block_index(offset, (rank, width), cols=iota(out_features, in_features))

  def operands(w_c, seed_c):
    # K-major operands, (rows, chunk * r) and (in, chunk * r): seeds and components last.
    seed_c = seed_c[None, :, None]
    q_a = noise_lib.unscaled_noise(seed_c, a_hi.T[:, None], a_lo.T[:, None], kind, high_word=high)
    q_b = noise_lib.unscaled_noise(seed_c, b_hi.T[:, None], b_lo.T[:, None], kind, high_word=high)
    a = (q_a * w_c[None, :, None]).astype(operand_dtype).reshape(hi - lo, -1)
    return a, q_b.astype(operand_dtype).reshape(in_features, -1)

  def gemm(w_c, seed_c, total, last):
    # No fixed order to protect: XLA may fold what follows into the last GEMM's epilogue
    # (the cast to the parameters' dtype; an SGD step where nothing else reads the gradient).
    del last
    product = jax.lax.dot_general(*operands(w_c, seed_c), _DIMS_NT, preferred_element_type=_F32,
                                  precision=None if config.tf32 else jax.lax.Precision.HIGHEST)
    return product if total is None else total + product

  tile_update = None if update is None else (update[0], jnp.reshape(update[1], (1,)))

  def tiles(w_c, seed_c, total, last):
    # Materialised operands: XLA fuses nothing into the contraction.
    a, b = jax.lax.optimization_barrier(operands(w_c, seed_c))
    ending = dict(out_dtype=out_dtype, update=tile_update) if last else {}
    return tile_products(a, b, config=config, interpret=interpret, total=total, **ending)

  total = _sum_over_chunks(gemm if config.xla_gemm else tiles, weights, pair_seeds, chunk)
  if update is not None and not config.xla_gemm:
    return total
  if update is not None:
    weight, step = update
    return (weight.astype(_F32) + step * total).astype(weight.dtype)
  return total[row0 - lo:row0 - lo + n_rows].astype(out_dtype)
