"""Pallas kernel (Mosaic GPU backend, Hopper) of the low-rank forward: one GEMM, noise in its epilogue.

EGGROLL's setting: every member one input row, members in antithetic pairs
(``2j`` and ``2j + 1`` share ``A_j``, ``B_j`` with signs ``+1`` / ``-1``).
Member ``i``'s output is

    y_i = x_i W^T + b + s_i sigma [scale^2 (x_i B_i) A_i^T / sqrt(r) + scale q_bias]

(:mod:`jaxnoise.noise`, "Low-rank layout"). The Triton path runs XLA's GEMM
and then a kernel that reads its output, hashes ``A_i`` and writes the sum:
one more pass over the output, which capped it near 94% of the GEMM alone on
an H200 (``benchmarks/RESULTS.md``, session 4). Here one warp-specialised,
persistent Mosaic GPU GEMM computes ``x W^T`` with ``wgmma`` (``W`` read as
stored, ``(out, in)``, through a transposed shared-memory view) and, before
a tile leaves the registers, adds the noise.

Members of several rows (``rows`` a multiple of 64, e.g. a sequence's
tokens): ``x`` is viewed as ``(pop * rows, in)`` and a tile is 64 rows of one
pair, its ``+`` member's rows and the ``-`` member's same rows (``rows`` further
down), so the tile's noise is the pair's ``A`` row for every row; the
operands (keys, coefficients) are per row, pair-major, in both layouts. After
the main loop each warpgroup hashes the pair's noise vectors (``A``'s
components and the bias's) over its columns once, one value a thread, into
shared memory, and the epilogue reads them back in the layout of the
accumulator's columns and broadcasts them over the 64 rows: 1/64 of the
hashing per element (a tile of 64 pairs must hash every element). Where the
factor values are exact as ``wgmma`` operands (:func:`member_dots_supported`:
"binomial" and "rademacher", rank <= 8) the GEMM also forms ``x_i B_i``
itself ("member dots"): the pair's factor rows (:class:`MemberDotOperands`,
made by XLA) are loaded beside ``x``'s tile and one more ``wgmma`` per step
and sign fills a ``(64, DOT_COLS)`` accumulator, so no kernel reads ``x``
before the GEMM. (Compiled tests pass on an H100 under jax 0.11.2, every kind,
bf16 / f16 / f32, 64-192 rows; the LM's bf16 ES step went from 145.2 to 122.8
device ms at rank 1, session 31. :data:`MULTI_ROW_MEMBERS` switches it off.)

One row per member: the pair shares its noise, so the GEMM keeps the pair's two rows in two
accumulators: ``x`` is viewed (for free) as ``(pop / 2, 2 * in)``, whose
row ``j`` is ``[x_2j | x_2j+1]``, and each program multiplies 64 pairs'
``+`` halves and ``-`` halves into two ``(64, tile_n)`` accumulators. Every
noise value is then hashed once per pair and added to both, with opposite
signs; the output is written as ``(pop / 2, 2 * out)``, the same bytes as
``(pop, out)``. ``x_i B_i`` (and the per-pair stream keys) come first from a
Triton kernel (:func:`pallas_triton_low_rank.fused_gemm_operands`).

The tensor cores wait while the epilogue hashes ``A_i`` (rank 4 took ~9 µs
more than rank 1 on an H100, session 25). Adding noise to the accumulators
inside the main loop serialises every ``wgmma`` (ptxas's note C7515, session
27), so with ``LowRankLinearConfig.gemm_noise_ahead`` the main loop instead
hashes a few values of the leading components per step, after the step's
``wgmma`` is issued, and stores each value's code
(:meth:`jaxnoise.noise.NoiseKind.code`, one byte for "binomial") to shared
memory (:func:`ahead_schedule`); the epilogue turns the codes into values
and adds them in the same order as before, so the sum is unchanged bit for
bit (compiled test on an H100, every kind). Measured (session 28, H100,
bf16): it saves only ~1.1 µs of rank 4's ~8 µs over rank 1, so it is off by
default; the SASS shows the hashing between the step's ``HGMMA`` issue and
its wait, without spills, so what the rank-4 GEMM loses is not simply the
epilogue's hashing time.

Same noise as every other path, bit for bit: :func:`tile_noise` is the
library's hash (:func:`jaxnoise.noise.hash_word` and the kind's integer
``q``) and a CPU test compares :func:`fused_forward_xla`, the same
arithmetic on whole arrays, with the reference.

Eligible calls (:func:`unsupported_reason` says why not; the caller then
takes the Triton path): a Hopper GPU; 16-bit or float32 x with one row per
member (``pop`` a multiple of 128) or (while :data:`MULTI_ROW_MEMBERS` is
on) a multiple of 64 rows, in antithetic pairs; ``out`` a multiple of
``2 * gemm_tile_n`` and ``in`` of the step depth (:func:`step_depth`); the
layer's noise indices within one ``2**32`` window (in models of more than
4.3G parameters, the one layer per window boundary takes the Triton path).

Float32 x is multiplied as TF32 (``wgmma`` reads float32 operands that way),
which is what XLA's own GEMM does for float32 at the default precision on
this GPU, so the fused path takes float32 only where
``jax_default_matmul_precision`` allows TF32 or coarser (unset, "default",
"high", "tensorfloat32", "bfloat16", "TF32_TF32_F32" or "BF16_BF16_F32").
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxnoise import noise as noise_lib
from jaxnoise.ops import _mosaic
from jaxnoise.ops.virtual_noise import config as config_lib

_U32 = jnp.uint32
_F32 = jnp.float32

# Antithetic pairs per tile: one wgmma row group of 64 per sign.
TILE_PAIRS = 64
# Member dots: columns of the x B accumulators (the narrowest wgmma), rank <= DOT_COLS.
DOT_COLS = 8
# Members of 64k rows take the fused GEMM only when this is True (on since session 31,
# whose compiled tests passed on an H100 under jax 0.11.2; benchmarks/RESULTS.md). False
# sends them to the Triton path, as before.
MULTI_ROW_MEMBERS = True
# Threads of a warpgroup: a pair's noise vectors are hashed one value a thread, so at least
# this many columns a warpgroup (hashed_columns).
_WARPGROUP_THREADS = 128
# Shared memory left to the pipeline's barriers.
_BARRIER_BYTES = 4096
_COMPUTE_WARPGROUPS = 2
# jax_default_matmul_precision settings under which XLA may multiply float32 as
# TF32 (or coarser) on this GPU: the fused GEMM's TF32 is then no less precise.
_TF32_PRECISIONS = (None, "default", "high", "tensorfloat32", "bfloat16", "TF32_TF32_F32",
                    "BF16_BF16_F32")


def popcount(words: jax.Array) -> jax.Array:
  """Bits set in each uint32 word (SWAR), equal to ``lax.population_count``.

  Mosaic GPU has no lowering rule for ``lax.population_count``; these are
  plain integer operations it lowers.

  Example:
    >>> import jax.numpy as jnp
    >>> popcount(jnp.array([0, 1, 0xFFFFFFFF], jnp.uint32)).tolist()
    [0, 1, 32]
  """
  words = words - ((words >> _U32(1)) & _U32(0x55555555))
  words = (words & _U32(0x33333333)) + ((words >> _U32(2)) & _U32(0x33333333))
  words = (words + (words >> _U32(4))) & _U32(0x0F0F0F0F)
  return (words * _U32(0x01010101)) >> _U32(24)


def tile_noise(kind: noise_lib.NoiseKind, index_hi: int, start_lo: int, cols: jax.Array,
               multiplier: jax.Array, increment: jax.Array) -> jax.Array:
  """Integer-valued ``q`` at indices ``index_hi * 2**32 + start_lo + cols``.

  Args:
    kind: the noise kind.
    index_hi: the high 32 bits shared by every index (static).
    start_lo: the low 32 bits of the first index (static); ``start_lo + cols``
      must not pass ``2**32`` (:func:`window_fits`).
    cols: uint32 column offsets (any shape).
    multiplier: uint32 stream multipliers (broadcast against ``cols``):
      :func:`jaxnoise.noise.stream_keys` of the member's seed and
      :func:`word_hi`.
    increment: the matching increments.

  Returns:
    float32 ``q`` of ``cols``' shape (the kind's scale not applied).

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxnoise import noise as noise_lib
    >>> kind, seed = noise_lib.get_kind("binomial"), jnp.uint32(7)
    >>> multiplier, increment = noise_lib.stream_keys(seed, jnp.uint32(0))
    >>> q = tile_noise(kind, 0, 100, jnp.arange(4, dtype=jnp.uint32), multiplier, increment)
    >>> expected = noise_lib.unscaled_noise(seed, jnp.uint32(0),
    ...                                     jnp.arange(100, 104, dtype=jnp.uint32), kind)
    >>> bool((q == expected).all())
    True
  """
  return kind.from_code(tile_code(kind, index_hi, start_lo, cols, multiplier, increment))


def tile_code(kind: noise_lib.NoiseKind, index_hi: int, start_lo, cols: jax.Array,
              multiplier: jax.Array, increment: jax.Array) -> jax.Array:
  """:func:`tile_noise`'s values as the kind's uint32 code (:meth:`~jaxnoise.noise.NoiseKind.code`).

  ``start_lo`` may also be a traced uint32 scalar (the main loop's component).
  """
  index_lo = cols + (start_lo if isinstance(start_lo, jax.Array) else _U32(start_lo))
  shift = kind.log2_values_per_word
  lane = None
  if shift:
    lane = index_lo & _U32((1 << shift) - 1)
    high_bits = (index_hi << (32 - shift)) & 0xFFFFFFFF
    index_lo = (index_lo >> _U32(shift)) | _U32(high_bits)
  return kind.code(noise_lib.hash_word(multiplier, increment, index_lo), lane,
                   population_count=popcount)


def word_hi(kind: noise_lib.NoiseKind, offset: int) -> int:
  """The high word of the word index of ``offset`` (shared by a window, :func:`window_fits`)."""
  return (offset >> 32) >> kind.log2_values_per_word


def window_fits(offset: int, n_indices: int) -> bool:
  """Whether indices ``[offset, offset + n_indices)`` share their high 32 bits.

  Example:
    >>> window_fits(2**32 - 10, 10), window_fits(2**32 - 10, 11)
    (True, False)
  """
  return n_indices <= 0 or (offset >> 32) == ((offset + n_indices - 1) >> 32)


def step_depth(config: config_lib.LowRankLinearConfig, itemsize: int) -> int:
  """Contracted features per pipeline step: ``gemm_tile_k`` in 16-bit, half in float32.

  The same bytes per row either way (128 at the default, one swizzle group).

  Example:
    >>> step_depth(config_lib.LowRankLinearConfig(), 2), step_depth(
    ...     config_lib.LowRankLinearConfig(), 4)
    (64, 32)
  """
  return config.gemm_tile_k * 2 // itemsize


def shared_memory_plan(config: config_lib.LowRankLinearConfig, itemsize: int,
                       out_itemsize: int, reserved_bytes: int = 0) -> tuple[int, int]:
  """``(stages, store_cols)``: the pipeline depth and the epilogue's store width that fit.

  Shared memory holds ``stages`` steps of input tiles and, per compute
  warpgroup, two output chunks of ``(64, store_cols)`` that stream the
  finished tile out (one is written while the other's copy is in flight).
  The deepest pipeline (at most ``config.gemm_stages``) comes first, then
  the widest chunk (128 bytes a row, else 64 or 32) that fits beside it:
  on a Hopper GPU (227 KiB a block) four 128x256 steps of 64 bf16 or 32
  float32 features leave room for 64-byte chunks, not for 128-byte ones.
  ``reserved_bytes`` are taken first (the codes hashed ahead,
  :func:`noise_ahead_plan`). ``(0, 0)`` if not even two steps fit.

  Example:
    >>> shared_memory_plan(config_lib.LowRankLinearConfig(), 2, 2)
    (4, 32)
    >>> shared_memory_plan(config_lib.LowRankLinearConfig(gemm_stages=3), 4, 4)
    (3, 32)
  """
  per_stage = (2 * TILE_PAIRS + _COMPUTE_WARPGROUPS * config.gemm_tile_n) * step_depth(
      config, itemsize) * itemsize
  for stages in range(config.gemm_stages, 1, -1):
    for row_bytes in (128, 64, 32):
      store_cols = min(row_bytes // out_itemsize, config.gemm_tile_n)
      chunks = _COMPUTE_WARPGROUPS * 2 * TILE_PAIRS * store_cols * out_itemsize
      if (stages * per_stage + chunks + reserved_bytes + _BARRIER_BYTES
          <= _mosaic.SHARED_MEMORY_BYTES):
        return stages, store_cols
  return 0, 0


def multi_row_bytes(config: config_lib.LowRankLinearConfig, rank: int, with_bias: bool,
                    itemsize: int, member_dots: bool) -> int:
  """Shared memory that members of 64k rows take beside the pipeline and the output chunks.

  A pair's noise vectors (float32 per column, :func:`_forward_kernel`'s
  ``hash_pair_columns``) and, with member dots, each pipeline stage's
  ``(DOT_COLS, step)`` tile of factor rows (counted for ``config.gemm_stages``).

  Example:
    >>> config = config_lib.LowRankLinearConfig()
    >>> multi_row_bytes(config, 4, True, 2, False), multi_row_bytes(config, 4, True, 2, True)
    (5120, 9216)
  """
  vectors = _COMPUTE_WARPGROUPS * (rank + with_bias) * hashed_columns(config.gemm_tile_n) * 4
  factor_tiles = config.gemm_stages * DOT_COLS * step_depth(config, itemsize) * itemsize
  return vectors + (factor_tiles if member_dots else 0)


def pipelined_tiles(config: config_lib.LowRankLinearConfig, n_steps: int, stages: int,
                    tiles: int, num_sms: int) -> bool:
  """Whether the GEMM runs its tiles as one pipeline per multiprocessor
  (``config.gemm_pipelined_tiles``, Pallas' ``pipeline_state``).

  Pallas chains pipelines only where a tile's ``n_steps`` divide by the
  pipeline's depth; the first tile of a multiprocessor starts the chain and
  its last one stops it, so each multiprocessor needs two tiles at least.

  Example:
    >>> config = config_lib.LowRankLinearConfig(gemm_pipelined_tiles=True)
    >>> pipelined_tiles(config, 8, 4, 16384, 132), pipelined_tiles(config, 10, 4, 16384, 132)
    (True, False)
    >>> pipelined_tiles(config, 8, 4, 200, 132)  # some multiprocessors have one tile
    False
  """
  return (config.gemm_pipelined_tiles and n_steps % stages == 0
          and tiles >= 2 * num_sms)


def hashed_columns(tile_n: int) -> int:
  """Columns of a pair's noise vectors that a warpgroup hashes per tile of 64k rows: its
  ``tile_n``, at least one a thread (at ``tile_n = 64`` the last 64 are hashed and unused).

  Example:
    >>> hashed_columns(128), hashed_columns(64)
    (128, 128)
  """
  return max(tile_n, _WARPGROUP_THREADS)


class MemberDotOperands(NamedTuple):
  """Operands of the fused GEMM that forms ``x B`` itself (members of 64k rows).

  Attributes:
    keys: uint32 ``(2, pop / 2)``, each pair's stream multiplier and increment
      (:func:`jaxnoise.noise.stream_keys` at :func:`word_hi`).
    factors: ``(pop / 2 * DOT_COLS, in)`` of ``x``'s dtype: row
      ``DOT_COLS j + c`` is pair ``j``'s unscaled ``q(B_c)`` for ``c < r``
      (exact: the kinds of :func:`member_dots_supported` are small integers),
      zero for ``c >= r``.
    scalars: float32 ``(2,)``: ``sigma scale^2 / sqrt(r)`` and ``sigma scale``.
  """

  keys: jax.Array
  factors: jax.Array
  scalars: jax.Array


def member_dots_supported(kind: noise_lib.NoiseKind, rank: int, member_rows: int) -> bool:
  """Whether the GEMM forms ``x B`` itself: members of 64k rows, ``q`` exact in 8 bits.

  The factor rows then go to the tensor cores in ``x``'s dtype (16-bit, or
  TF32 for float32), which hold "binomial"'s ``[-16, 16]`` and
  "rademacher"'s ``+-1`` exactly; "normal" and "uniform" keep the operands
  kernel (:func:`pallas_triton_low_rank.fused_gemm_operands`).

  Example:
    >>> binomial = noise_lib.get_kind("binomial")
    >>> member_dots_supported(binomial, 1, 64), member_dots_supported(binomial, 1, 1)
    (True, False)
    >>> member_dots_supported(noise_lib.get_kind("normal"), 1, 64)
    False
  """
  return member_rows > 1 and kind.code_bits == 8 and rank <= DOT_COLS


def member_dot_operands(seeds, sigma, *, kind: noise_lib.NoiseKind, offset: int,
                        weight_shape, rank: int, dtype) -> MemberDotOperands:
  """:class:`MemberDotOperands` of antithetic ``seeds`` (XLA: a few values per pair)."""
  out_features, in_features = weight_shape
  pair_seeds = noise_lib.as_seeds(seeds)[0::2]
  multiplier, increment = noise_lib.stream_keys(pair_seeds, _U32(word_hi(kind, offset)))
  width = out_features + in_features
  cols = out_features + lax.broadcasted_iota(_U32, (1, in_features), 1)
  b_hi, b_lo = noise_lib.block_index(offset, (rank, width), cols=cols)
  q_b = noise_lib.unscaled_noise(pair_seeds[:, None, None], b_hi[None], b_lo[None], kind,
                                 high_word=not noise_lib.fits_32_bits(kind, offset, rank * width))
  # DOT_COLS rows a pair (zeros past r): every pair's rows start on an 8-row TMA tile, which
  # Mosaic's layout inference must be able to prove (pair * DOT_COLS).
  factors = jnp.pad(q_b.astype(dtype), ((0, 0), (0, DOT_COLS - rank), (0, 0)))
  factors = factors.reshape(-1, in_features)
  sigma = jnp.asarray(sigma, _F32)
  scalars = jnp.stack([sigma * _F32(kind.scale * kind.scale / rank ** 0.5),
                       sigma * _F32(kind.scale)])
  return MemberDotOperands(jnp.stack([multiplier, increment]), factors, scalars)


def code_piece_cols(kind: noise_lib.NoiseKind) -> int:
  """Columns of one piece of codes hashed ahead: 32-byte rows (Mosaic's narrowest swizzle).

  Example:
    >>> [code_piece_cols(noise_lib.get_kind(k)) for k in ("binomial", "normal", "uniform")]
    [32, 16, 8]
  """
  return 256 // kind.code_bits


def noise_ahead_plan(config: config_lib.LowRankLinearConfig, kind: noise_lib.NoiseKind,
                     rank: int, itemsize: int, out_itemsize: int) -> tuple[int, int, int]:
  """``(stages, store_cols, ahead)``: :func:`shared_memory_plan` beside the codes hashed ahead.

  ``ahead`` (at most ``config.gemm_noise_ahead`` and ``rank``) components'
  codes take ``2 * 64 * gemm_tile_n`` values of ``kind.code_bits`` each in
  shared memory; fewer are hashed ahead where the pipeline would not keep
  two stages beside them.

  Example:
    >>> binomial = noise_lib.get_kind("binomial")
    >>> noise_ahead_plan(config_lib.LowRankLinearConfig(), binomial, 4, 2, 2)
    (4, 32, 0)
    >>> noise_ahead_plan(config_lib.LowRankLinearConfig(gemm_noise_ahead=4), binomial, 4, 2, 2)
    (3, 16, 4)
    >>> noise_ahead_plan(config_lib.LowRankLinearConfig(gemm_noise_ahead=4), binomial, 1, 2, 2)
    (4, 16, 1)
  """
  plane_bytes = _COMPUTE_WARPGROUPS * TILE_PAIRS * config.gemm_tile_n * kind.code_bits // 8
  for ahead in range(min(config.gemm_noise_ahead, rank), 0, -1):
    stages, store_cols = shared_memory_plan(config, itemsize, out_itemsize, ahead * plane_bytes)
    if stages >= 2:
      return stages, store_cols, ahead
  return (*shared_memory_plan(config, itemsize, out_itemsize), 0)


def member_rows_tile(m_index, member_rows: int):
  """Where row tile ``m_index`` of members of ``member_rows`` rows (a multiple of 64) reads.

  The per-row operands are pair-major (row ``j * member_rows + t`` is pair
  ``j``'s row ``t``), and tile ``m`` covers their rows ``64 m .. 64 m + 63``:
  rows ``t .. t + 63`` of one pair ``j``. In ``x`` viewed as
  ``(pop * member_rows, in)`` its ``+`` member's rows start at ``2 j
  member_rows + t`` and its ``-`` member's ``member_rows`` further.

  Args:
    m_index: the tile (an int, or a traced int32 in the kernel).
    member_rows: rows per member.

  Returns:
    ``(pair_row, plus_row)``: the pair's first row of the per-row operands
    (``j * member_rows``) and the tile's first row of ``x`` for the ``+``
    member.

  Example:
    >>> [member_rows_tile(m, 128) for m in range(4)]
    [(0, 0), (0, 64), (128, 256), (128, 320)]
  """
  pair_row = (m_index // (member_rows // TILE_PAIRS)) * member_rows
  return pair_row, m_index * TILE_PAIRS + pair_row


def ahead_schedule(n_steps: int, n_pieces: int) -> tuple[int, int]:
  """``(per_step, spacing)``: the main loop hashes ``per_step`` pieces at every ``spacing``-th step.

  Group ``g`` (pieces ``g * per_step`` to ``g * per_step + per_step - 1``,
  those below ``n_pieces``) runs at step ``g * spacing``: spread evenly, and
  every piece is hashed before the loop ends.

  Example:
    >>> ahead_schedule(128, 32), ahead_schedule(8, 32), ahead_schedule(3, 32)
    ((1, 4), (4, 1), (11, 1))
  """
  per_step = -(-n_pieces // n_steps)
  groups = -(-n_pieces // per_step)
  return per_step, n_steps // groups


def unsupported_reason(x_shape, x_dtype, out_features: int, offset: int, n_indices: int,
                       rank: int, antithetic: bool, out_dtype,
                       config: config_lib.LowRankLinearConfig, interpret: bool) -> str | None:
  """Why the fused Mosaic GPU forward cannot run this call (None if it can)."""
  if not config.fused_gemm:
    return "config.fused_gemm is False"
  if interpret or not _mosaic.is_hopper():
    return "needs a Hopper GPU (compute capability 9.x)"
  if len(x_shape) != 3 or (x_shape[1] != 1 and x_shape[1] % TILE_PAIRS):
    return (f"needs per-individual x with one row per member or a multiple of "
            f"{TILE_PAIRS}, got shape {tuple(x_shape)}")
  if x_shape[1] != 1 and not MULTI_ROW_MEMBERS:
    return (f"members of {x_shape[1]} rows take the Triton path while "
            f"mosaic_gpu_low_rank.MULTI_ROW_MEMBERS is False")
  if not antithetic:
    return "needs antithetic pairs"
  x_dtype = jnp.dtype(x_dtype)
  if x_dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16), jnp.dtype(jnp.float32)):
    return f"needs bfloat16, float16 or float32 x, got {x_dtype.name}"
  precision = jax.config.jax_default_matmul_precision
  if x_dtype == jnp.dtype(jnp.float32) and precision not in _TF32_PRECISIONS:
    return (f"float32 x runs as TF32, coarser than jax_default_matmul_precision="
            f"{precision!r} asks for")
  pop, member_rows, in_features = x_shape
  if member_rows == 1 and pop % (2 * TILE_PAIRS):
    return f"pop = {pop} is not a multiple of {2 * TILE_PAIRS}"
  if out_features % (_COMPUTE_WARPGROUPS * config.gemm_tile_n):
    return (f"out = {out_features} is not a multiple of "
            f"{_COMPUTE_WARPGROUPS * config.gemm_tile_n}")
  depth = step_depth(config, x_dtype.itemsize)
  if in_features % depth:
    return f"in = {in_features} is not a multiple of {depth}"
  if rank > config_lib.MAX_KERNEL_RANK:
    return f"rank {rank} > {config_lib.MAX_KERNEL_RANK}"
  if not window_fits(offset, n_indices):
    return "the layer's noise indices cross a multiple of 2**32"
  reserved = 0 if x_shape[1] == 1 else multi_row_bytes(config, rank, True, x_dtype.itemsize,
                                                       True)
  if shared_memory_plan(config, x_dtype.itemsize, jnp.dtype(out_dtype).itemsize,
                        reserved)[0] < 2:
    return "the tiles do not fit twice in shared memory"
  return None


def add_pair_noise(accs, cols, multiplier, increment, coefs, bias, bias_coefs, *,
                   kind: noise_lib.NoiseKind, index_hi: int, a_starts: tuple,
                   bias_start: int | None, leading_q: tuple = (), bias_q=None):
  """The epilogue on a pair's ``(plus, minus)`` accumulators; each noise value hashed once.

  ``plus += sum_c coef_c^+ q(A_c) [+ bias + bias_coef^+ q(bias)]``, the same
  for ``minus`` with its coefficients (which carry the sign). Operands
  broadcast against the accumulators (rows: pairs; columns: outputs):
  ``cols`` holds the output index, ``multiplier`` / ``increment`` and each
  ``(plus, minus)`` coefficient are per pair, ``bias`` per column. The
  kernel passes register tiles, :func:`fused_forward_xla` whole arrays.
  ``leading_q``: the first components' ``q``, made already (hashed ahead, or
  once per column for a tile of one pair's rows); the others are hashed here;
  ``bias_q`` likewise for the bias. Either way the sum is formed in one order.
  """
  plus, minus = accs
  for c, ((coef_plus, coef_minus), start) in enumerate(zip(coefs, a_starts)):
    if c < len(leading_q):
      q = leading_q[c]
    else:
      q = tile_noise(kind, index_hi, start, cols, multiplier, increment)
    plus, minus = plus + coef_plus * q, minus + coef_minus * q
  if bias_start is not None:
    q = bias_q if bias_q is not None else tile_noise(kind, index_hi, bias_start, cols,
                                                     multiplier, increment)
    plus = plus + (bias + bias_coefs[0] * q)
    minus = minus + (bias + bias_coefs[1] * q)
  return plus, minus


def _forward_kernel(x_gmem, w_gmem, keys_gmem, coef_gmem, *refs,
                    kind: noise_lib.NoiseKind, index_hi: int, a_starts: tuple,
                    bias_start: int | None, config: config_lib.LowRankLinearConfig,
                    stages: int, store_cols: int, ahead: int, member_rows: int,
                    member_dots: bool = False, num_sms: int):
  factors_gmem = scalars_gmem = bias_coef_gmem = None
  if member_dots:  # (keys, factors, scalars[, bias], out): MemberDotOperands
    factors_gmem, coef_gmem, (scalars_gmem, *refs) = coef_gmem, None, refs
    bias_gmem, out_gmem = refs if bias_start is not None else (None, *refs)
  else:
    bias_gmem, bias_coef_gmem, out_gmem = refs if bias_start is not None else (None, None) + refs
  n_out = w_gmem.shape[0]
  if member_rows == 1:  # x as (pop / 2, 2 * in): a tile is 64 pairs
    n_rows, depth = x_gmem.shape[0], x_gmem.shape[1] // 2
  else:  # x as (pop * rows, in): a tile is 64 rows of one pair's members
    n_rows, depth = x_gmem.shape[0] // 2, x_gmem.shape[1]
  itemsize = jnp.dtype(x_gmem.dtype).itemsize
  tile_n, tile_k = config.gemm_tile_n, step_depth(config, itemsize)
  cta_n = _COMPUTE_WARPGROUPS * tile_n
  swizzle = plgpu.find_swizzle(tile_k * itemsize * 8)
  transforms = (plgpu.TilingTransform((8, swizzle // itemsize)), plgpu.SwizzleTransform(swizzle))
  out_itemsize = jnp.dtype(out_gmem.dtype).itemsize
  out_swizzle = plgpu.find_swizzle(store_cols * out_itemsize * 8)
  out_transforms = (plgpu.TilingTransform((8, out_swizzle // out_itemsize)),
                    plgpu.SwizzleTransform(out_swizzle))
  m_tiles, n_tiles = n_rows // TILE_PAIRS, n_out // cta_n
  n_steps = depth // tile_k
  pipelined = pipelined_tiles(config, n_steps, stages, m_tiles * n_tiles, num_sms)
  a_stride = n_out + depth  # component c's A starts c * (out + in) after component 0's
  column_starts = a_starts + (() if bias_start is None else (bias_start,))
  # Codes hashed ahead: (64, piece_cols) pieces of 32-byte rows.
  code_dtype = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32}[kind.code_bits]
  piece_cols = code_piece_cols(kind)
  code_swizzle = piece_cols * kind.code_bits // 8
  blocks = tile_n // piece_cols
  per_step, spacing = ahead_schedule(n_steps, ahead * blocks) if ahead else (0, 1)
  x_spec = plgpu.BlockSpec((TILE_PAIRS, tile_k), lambda k: (0, k), transforms=transforms,
                           memory_space=plgpu.SMEM)
  # Member dots: the pair's B factor rows (DOT_COLS from its first, the rest unused).
  factor_specs = [plgpu.BlockSpec((DOT_COLS, tile_k), lambda k: (0, k), transforms=transforms,
                                  memory_space=plgpu.SMEM)] if member_dots else []

  def pipeline(body, context, state=None):
    """The tile's pipeline; ``state`` (:func:`pipelined_tiles`): its place in the chain."""
    return plgpu.emit_pipeline_warp_specialized(
        body, grid=(depth // tile_k,), memory_registers=40,
        in_specs=[x_spec, x_spec,
                  plgpu.BlockSpec((cta_n, tile_k), lambda k: (0, k), transforms=transforms,
                                  memory_space=plgpu.SMEM)] + factor_specs,
        wg_axis="wg", num_compute_wgs=_COMPUTE_WARPGROUPS, max_concurrent_steps=stages,
        compute_context=context, pipeline_state=state)

  def ignore(*_, **__):
    return None

  if member_rows == 1:
    x_plus, x_minus = x_gmem.at[:, pl.ds(0, depth)], x_gmem.at[:, pl.ds(depth, depth)]
  else:
    x_plus = x_minus = x_gmem

  @functools.partial(
      pl.run_scoped,
      allocations=pipeline(ignore, ignore).get_allocations(
          x_plus, x_minus, w_gmem,
          *([factors_gmem.at[pl.ds(0, DOT_COLS)]] if member_dots else [])),
      out_smem=plgpu.SMEM((_COMPUTE_WARPGROUPS, 2, TILE_PAIRS, store_cols), out_gmem.dtype,
                          transforms=out_transforms),
      **({} if not ahead else dict(codes_smem=plgpu.SMEM(
          (_COMPUTE_WARPGROUPS, ahead, TILE_PAIRS, tile_n), code_dtype,
          transforms=(plgpu.TilingTransform((8, piece_cols)),
                      plgpu.SwizzleTransform(code_swizzle))))),
      **({} if member_rows == 1 else dict(column_noise_smem=plgpu.SMEM(
          (_COMPUTE_WARPGROUPS, len(column_starts), hashed_columns(tile_n)), _F32))),
      collective_axes="wg")
  def _scope(allocations, out_smem, codes_smem=None, column_noise_smem=None):
    wg = lax.axis_index("wg")

    @plgpu.nd_loop((m_tiles * n_tiles,), collective_axes="sm")
    def _tile(info):
      (linear,) = info.index
      m_index, n_index = plgpu.planar_snake(linear, (m_tiles, n_tiles), 1,
                                            config.gemm_grid_width)
      # The tile's rows of the per-row vectors (keys, coefficients): 64 pairs, or 64 rows of
      # one pair's members.
      pair0 = m_index * TILE_PAIRS
      col0 = n_index * cta_n + wg * tile_n
      pairs_at = pl.ds(pair0, TILE_PAIRS)
      if member_rows == 1:
        x_rows = (x_plus.at[pairs_at], x_minus.at[pairs_at])
        out_rows = lambda sign, cols: out_gmem.at[pairs_at, pl.ds(sign * n_out + cols,
                                                                   store_cols)]
      else:
        pair_row, plus_row = member_rows_tile(m_index, member_rows)
        # Row starts the copies' tiling needs proven: multiples of 64 (and of 8 below).
        member_at = lambda sign: pl.ds(pl.multiple_of(plus_row + sign * member_rows, TILE_PAIRS),
                                       TILE_PAIRS)
        x_rows = tuple(x_gmem.at[member_at(sign)] for sign in range(2))
        # The pair's keys: at its first row of the per-row operands, or (member dots) per pair.
        key_index = pair_row
        if member_dots:
          key_index = m_index // (member_rows // TILE_PAIRS)
          factor_rows = (factors_gmem.at[pl.ds(pl.multiple_of(key_index * DOT_COLS, DOT_COLS),
                                               DOT_COLS)],)
        out_rows = lambda sign, cols: out_gmem.at[member_at(sign), pl.ds(cols, store_cols)]
      shape = (TILE_PAIRS, tile_n)

      def per_pair(ref, cols=tile_n):
        return lax.broadcast_in_dim(_mosaic.load_rows(ref), (TILE_PAIRS, cols), [0])

      def col_iota(cols):
        return lax.bitcast_convert_type(plgpu.broadcasted_iota(
            jnp.int32, (TILE_PAIRS, cols), 1, layout=plgpu.Layout.WGMMA), _U32)

      def pair_rows():
        """The per-pair vectors (two registers a thread each): keys, coefficients, bias's."""
        rows = lambda ref: _mosaic.load_rows(ref.at[pairs_at])
        return dict(keys=[rows(keys_gmem.at[s]) for s in range(2)],
                    coefs=[[rows(coef_gmem.at[c, s]) for s in range(2)]
                           for c in range(len(a_starts))],
                    bias_coefs=None if bias_start is None else [
                        rows(bias_coef_gmem.at[s]) for s in range(2)])

      def epilogue(accs, sl=slice(None), hoisted=None, dots=None):
        """The noisy accumulators' columns ``sl`` (a store chunk, or all).

        ``hoisted``: :func:`pair_rows`, loaded before the main loop (else loaded here).
        ``dots``: :func:`member_coefficients` (member dots).
        """
        width = tile_n if sl == slice(None) else sl.stop - sl.start
        first = 0 if sl == slice(None) else sl.start
        if dots is not None:
          keys = [None, None]
          coefs = [[lax.broadcast_in_dim(v, (TILE_PAIRS, width), [0]) for v in c]
                   for c in dots["coefs"]]
          bias_coefs = [lax.broadcast_in_dim(v, (TILE_PAIRS, width), ())
                        for v in dots["bias_coefs"]]
        elif hoisted is None:
          pair = lambda ref: per_pair(ref.at[pairs_at], width)
          # One pair's rows hash from column vectors (below): no per-row keys or columns.
          keys = [pair(keys_gmem.at[s]) if member_rows == 1 else None for s in range(2)]
          coefs = [[pair(coef_gmem.at[c, s]) for s in range(2)] for c in range(len(a_starts))]
          bias_coefs = None if bias_start is None else [
              pair(bias_coef_gmem.at[s]) for s in range(2)]
        else:
          pair = lambda rows: lax.broadcast_in_dim(rows, (TILE_PAIRS, width), [0])
          keys = [pair(v) for v in hoisted["keys"]]
          coefs = [[pair(v) for v in c] for c in hoisted["coefs"]]
          bias_coefs = None if bias_start is None else [pair(v) for v in hoisted["bias_coefs"]]
        cols = (col_iota(width) + lax.convert_element_type(col0 + first, _U32)
                if member_rows == 1 else None)
        bias = None
        if bias_start is not None:
          bias = lax.broadcast_in_dim(
              _mosaic.load_columns(bias_gmem.at[pl.ds(col0 + first, width)]), (TILE_PAIRS, width),
              [1])
        leading_q = tuple(
            kind.from_code(codes_smem[wg, c, :, pl.ds(first, width)].astype(_U32))
            for c in range(ahead))
        bias_q = None
        if member_rows > 1:
          # One pair's rows: the pair's noise vectors (hash_pair_columns), read in the layout
          # of the accumulator's columns and broadcast over the rows.
          spread = lambda v: lax.broadcast_in_dim(
              _mosaic.load_columns(column_noise_smem.at[wg, v, pl.ds(first, width)]),
              (TILE_PAIRS, width), [1])
          leading_q = tuple(spread(v) for v in range(len(a_starts)))
          if bias_start is not None:
            bias_q = spread(len(a_starts))
        return add_pair_noise((accs[0][:, sl], accs[1][:, sl]), cols, *keys, coefs, bias,
                              bias_coefs, kind=kind, index_hi=index_hi, a_starts=a_starts,
                              bias_start=bias_start, leading_q=leading_q, bias_q=bias_q)

      def hash_pair_columns():
        """One pair's rows: its noise vectors (``A``'s components, the bias's) over the
        warpgroup's ``tile_n`` columns (:func:`hashed_columns`) to shared memory, each value
        hashed by one thread."""
        width = hashed_columns(tile_n)
        strided = plgpu.Layout.WG_STRIDED((width,), vec_size=1)
        cols = lax.bitcast_convert_type(
            plgpu.broadcasted_iota(jnp.int32, (width,), 0, layout=strided), _U32)
        cols = cols + lax.convert_element_type(col0, _U32)
        keys = [lax.broadcast_in_dim(keys_gmem[s, key_index], (width,), ()) for s in range(2)]
        # The previous tile's reads of these vectors are done (one warpgroup barrier).
        plgpu.commit_smem()
        for v, start in enumerate(column_starts):
          column_noise_smem[wg, v] = tile_noise(kind, index_hi, start, cols, *keys)
        plgpu.commit_smem()

      def member_coefficients(dot_accs):
        """Member dots: the per-row coefficients ``s sigma scale^2 / sqrt(r) (x B_c)`` from
        the ``(64, DOT_COLS)`` accumulators of ``x`` times the pair's factor rows (column
        ``c`` is component ``c``), in the layout of the accumulator's rows; the bias's
        ``s sigma scale`` as scalars."""
        factor, noise_scale = scalars_gmem[0], scalars_gmem[1]
        component = plgpu.broadcasted_iota(jnp.int32, (TILE_PAIRS, DOT_COLS), 1,
                                           layout=plgpu.Layout.WGMMA)
        flips = (factor, -factor)
        coefs = [[flips[sign] * jnp.sum(jnp.where(component == c, dot_accs[sign], 0.0),
                                        axis=1) for sign in range(2)]
                 for c in range(len(a_starts))]
        return dict(coefs=coefs, bias_coefs=[noise_scale, -noise_scale])

      # With codes hashed ahead, the per-pair vectors are loaded before the main loop (its
      # hashing needs the keys; the epilogue's chunks share them all), set by `context`.
      hoisted_rows = []

      def context(run_pipeline):
        if ahead:
          hoisted_rows.append(pair_rows())

        dot_shape = (TILE_PAIRS, DOT_COLS)

        @functools.partial(
            pl.run_scoped, plus_ref=plgpu.ACC(shape, _F32), minus_ref=plgpu.ACC(shape, _F32),
            **({} if not member_dots else dict(dots_ref=(plgpu.ACC(dot_shape, _F32),
                                                         plgpu.ACC(dot_shape, _F32)))))
        def _accumulate(plus_ref, minus_ref, dots_ref=()):
          run_pipeline((plus_ref, minus_ref, *dots_ref))
          if member_rows > 1:
            hash_pair_columns()
          dots = (member_coefficients([ref[...] for ref in dots_ref]) if member_dots
                  else None)
          accs = (plus_ref[...], minus_ref[...])
          # Without codes hashed ahead the whole tile's noise is formed first (as
          # measured in sessions 12-26); with them a store chunk at a time, so each
          # chunk's codes are loaded just before they are used.
          # The codes are read a piece wide at least (a piece may span store chunks).
          # One pair's rows: chunks of 64 columns (registers of the broadcast vectors).
          noise_cols = (max(store_cols, piece_cols) if ahead
                        else TILE_PAIRS if member_rows > 1 else tile_n)
          plgpu.wait_smem_to_gmem(0, wait_read_only=True)
          for first in range(0, tile_n, noise_cols):
            noisy = (epilogue(accs, slice(first, first + noise_cols), hoisted_rows[0]) if ahead
                     else epilogue(accs, slice(first, first + noise_cols), dots=dots)
                     if noise_cols < tile_n else epilogue(accs, dots=dots))
            for c in range(noise_cols // store_cols):
              chunk = slice(c * store_cols, (c + 1) * store_cols)
              for sign in range(2):
                plgpu.wait_smem_to_gmem(1, wait_read_only=True)
                out_smem[wg, sign] = noisy[sign][:, chunk].astype(out_gmem.dtype)
                plgpu.commit_smem()
                plgpu.copy_smem_to_gmem(out_smem.at[wg, sign],
                                        out_rows(sign, col0 + first + chunk.start))

      def hash_ahead(step):
        """Codes of pieces ``(component, column block)`` for the epilogue, a few a step."""
        keys = [lax.broadcast_in_dim(k, (TILE_PAIRS, piece_cols), [0])
                for k in hoisted_rows[0]["keys"]]
        group = step // spacing

        @pl.when((step % spacing == 0) & (group * per_step < ahead * blocks))
        def _hash():
          for i in range(per_step):
            piece = group * per_step + i

            @pl.when(piece < ahead * blocks)
            def _piece():
              component, block = piece // blocks, piece % blocks
              start = _U32(a_starts[0]) + lax.convert_element_type(component, _U32) * _U32(
                  a_stride)
              cols = col_iota(piece_cols) + lax.convert_element_type(
                  col0 + block * piece_cols, _U32)
              code = tile_code(kind, index_hi, start, cols, *keys)
              codes_smem[wg, component, :, pl.ds(block * piece_cols, piece_cols)] = (
                  code.astype(code_dtype))

      def multiply(indices, plus_smem, minus_smem, w_smem, *rest):
        *factors_smem, accs = rest
        w_tile = w_smem.at[pl.ds(wg * tile_n, tile_n)].transpose((1, 0))
        plgpu.wgmma(accs[0], plus_smem, w_tile)
        plgpu.wgmma(accs[1], minus_smem, w_tile)
        if member_dots:  # x B of the pair's rows (each warpgroup forms them for its columns)
          factors_tile = factors_smem[0].transpose((1, 0))
          plgpu.wgmma(accs[2], plus_smem, factors_tile)
          plgpu.wgmma(accs[3], minus_smem, factors_tile)
        if ahead:
          # While the step's wgmmas run; no accumulator is touched (ptxas's C7515).
          hash_ahead(indices[0])
        plgpu.wgmma_wait(0)
        return accs

      state = None
      if pipelined:
        # The first tile of this multiprocessor starts the chain, its last one stops it.
        chain = plgpu.PipelinePipeline
        state = jnp.where(info.local_index == 0, chain.START,
                          jnp.where(info.local_index == info.num_local_steps - 1, chain.STOP,
                                    chain.STEADY))
      pipeline(multiply, context, state)(
          *x_rows, w_gmem.at[pl.ds(n_index * cta_n, cta_n), :],
          *(factor_rows if member_dots else ()), allocations=allocations)

  plgpu.wait_smem_to_gmem(0, wait_read_only=True)


def _statics(kind: noise_lib.NoiseKind, weight_shape, offset: int, rank: int, with_bias: bool):
  out_features, in_features = weight_shape
  width = out_features + in_features  # component c's A starts at offset + c * width
  bias_start = None
  if with_bias:
    bias_start = (offset + noise_lib.noise_block_size(weight_shape, rank)) & 0xFFFFFFFF
  return dict(kind=kind, index_hi=offset >> 32,
              a_starts=tuple((offset + c * width) & 0xFFFFFFFF for c in range(rank)),
              bias_start=bias_start)


def fused_forward(x, weight, bias, offset: int, operands, *, kind: noise_lib.NoiseKind,
                  rank: int, out_dtype, config: config_lib.LowRankLinearConfig,
                  num_sms: int | None = None):
  """``(pop, rows, out)`` low-rank forward of members in antithetic pairs, one Mosaic GEMM.

  Args:
    x: ``(pop, rows, in)`` bfloat16, float16 or float32 (multiplied as TF32);
      ``rows`` is 1 or a multiple of 64.
    weight: ``(out, in)``, cast to ``x``'s dtype.
    bias: ``(out,)`` or None.
    offset: the block's first noise index (static).
    operands: ``(keys, coef, bias_coef)`` from
      :func:`pallas_triton_low_rank.fused_gemm_operands`.
    kind: the noise kind.
    rank: ``r``.
    out_dtype: the output dtype.
    config: tiles (``gemm_*`` fields); :func:`unsupported_reason` must be None.
    num_sms: persistent programs (default: the device's multiprocessor count).

  Returns:
    ``(pop, rows, out)`` of ``out_dtype``.
  """
  pop, member_rows, in_features = x.shape
  out_features = weight.shape[0]
  member_dots = isinstance(operands, MemberDotOperands)
  if member_dots and not member_dots_supported(kind, rank, member_rows):
    raise ValueError(f"member dots need members of 64k rows, rank <= {DOT_COLS} and a kind "
                     f"of 8-bit codes, got {member_rows} rows, rank {rank}, {kind.name!r}")
  itemsize, out_itemsize = jnp.dtype(x.dtype).itemsize, jnp.dtype(out_dtype).itemsize
  if member_rows == 1:
    stages, store_cols, ahead = noise_ahead_plan(config, kind, rank, itemsize, out_itemsize)
  else:  # the pair's noise vectors hashed once per tile: nothing to hash ahead
    stages, store_cols = shared_memory_plan(
        config, itemsize, out_itemsize,
        multi_row_bytes(config, rank, bias is not None, itemsize, member_dots))
    ahead = 0
  num_sms = num_sms or _num_sms()
  body = functools.partial(_forward_kernel, config=config, stages=stages, store_cols=store_cols,
                           ahead=ahead, member_rows=member_rows, member_dots=member_dots,
                           num_sms=num_sms,
                           **_statics(kind, weight.shape, offset, rank, bias is not None))
  if member_rows == 1:  # row j: [x_2j | x_2j+1], the output the same way
    x_rows, out_shape = x.reshape(pop // 2, 2 * in_features), (pop // 2, 2 * out_features)
  else:
    x_rows, out_shape = x.reshape(pop * member_rows, in_features), (pop * member_rows,
                                                                     out_features)
  call = _mosaic.kernel(
      body, out_type=jax.ShapeDtypeStruct(out_shape, out_dtype),
      grid=(num_sms,), grid_names=("sm",),
      num_threads=_COMPUTE_WARPGROUPS + 1, thread_name="wg")
  if member_dots:
    bias_operands = () if bias is None else (bias.astype(_F32),)
    out = call(x_rows, weight.astype(x.dtype), operands.keys, operands.factors.astype(x.dtype),
               operands.scalars, *bias_operands)
  else:
    keys, coef, bias_coef = operands
    bias_operands = () if bias is None else (bias.astype(_F32), bias_coef)
    out = call(x_rows, weight.astype(x.dtype), keys, coef, *bias_operands)
  return out.reshape(pop, member_rows, out_features)


def fused_forward_xla(x, weight, bias, offset: int, operands, *, kind: noise_lib.NoiseKind,
                      rank: int, out_dtype):
  """:func:`fused_forward`'s arithmetic in XLA: its reference, on any backend.

  The same operands and :func:`add_pair_noise` over all pairs at once (the
  kernel adds them tile by tile to its wgmma accumulators), so a CPU test
  checks the hash, the index starts and the per-pair coefficients bit for
  bit against the library's noise.
  """
  pop, member_rows, in_features = x.shape
  out_features = weight.shape[0]
  if isinstance(operands, MemberDotOperands):
    operands = member_dot_rows(x, operands, rank)
  keys, coef, bias_coef = operands
  products = jnp.dot(x.reshape(pop * member_rows, in_features), weight.astype(x.dtype).T,
                     preferred_element_type=_F32, precision=jax.lax.Precision.HIGHEST)
  # Rows (pair, member row) for each sign, the order of the per-row operands.
  products = products.reshape(pop // 2, 2, member_rows, out_features).transpose(1, 0, 2, 3)
  products = products.reshape(2, pop // 2 * member_rows, out_features)
  cols = jax.lax.broadcasted_iota(_U32, (1, out_features), 1)
  bias32 = None if bias is None else bias.astype(_F32)[None, :]
  plus, minus = add_pair_noise(
      (products[0], products[1]), cols, keys[0][:, None], keys[1][:, None],
      [[coef[c, s][:, None] for s in range(2)] for c in range(rank)], bias32,
      [bias_coef[s][:, None] for s in range(2)],
      **_statics(kind, weight.shape, offset, rank, bias is not None))
  out = jnp.stack([plus.reshape(pop // 2, member_rows, out_features),
                   minus.reshape(pop // 2, member_rows, out_features)], axis=1)
  return out.astype(out_dtype).reshape(pop, member_rows, out_features)


def member_dot_rows(x, operands: MemberDotOperands, rank: int):
  """:class:`MemberDotOperands` as the operands kernel's per-row ``(keys, coef, bias_coef)``.

  ``x B`` in float32 (products exact, summed in XLA's order; the kernel's
  ``wgmma`` sums in its own); the coefficients ``(s factor) (x B_c)`` as the
  operands kernel forms them.
  """
  pop, member_rows, in_features = x.shape
  pairs = pop // 2
  factors = operands.factors.reshape(pairs, DOT_COLS, in_features)[:, :rank].astype(_F32)
  dots = jnp.einsum("psti,pci->cspt", x.reshape(pairs, 2, member_rows, in_features).astype(_F32),
                    factors, precision=lax.Precision.HIGHEST)
  flips = jnp.array([1.0, -1.0], _F32)
  coef = (flips * operands.scalars[0])[None, :, None, None] * dots
  n_rows = pairs * member_rows
  bias_coef = jnp.broadcast_to((flips * operands.scalars[1])[:, None], (2, n_rows))
  return (jnp.repeat(operands.keys, member_rows, axis=1), coef.reshape(rank, 2, n_rows),
          bias_coef)


def _num_sms() -> int:
  if jax.default_backend() != "gpu":
    return 132  # lowering on a CPU for a Hopper target (tests): an H100 / H200 count
  return int(jax.devices()[0].core_count)
