"""Pallas kernel (Mosaic GPU backend, Hopper) of the packed ternary matmul: ``W`` decoded in registers.

``y = x (scale * t)^T`` with ``t`` the ternary values of the packed 6-bit
codes (:func:`jaxnoise.ops.ternary.pack_codes`' layout: 4 codes in 3 bytes
along ``in``). The kernel computes ``y^T = t x^T`` with ``wgmma``: ``A`` is a
warpgroup's 64 rows of ``t``, built in registers from the packed bytes, and
``B`` is ``x^T`` from shared memory. Only the 0.75-byte codes are read from
memory; no dense weight exists anywhere.

* **Which codes a thread decodes.** In the WGMMA register layout each thread
  holds, per 16-deep chunk ``j`` of ``A``, columns ``2c, 2c+1`` (register tile
  ``2j``) and ``2c+8, 2c+9`` (tile ``2j+1``) of two rows, ``c = lane % 4``. A
  64-deep step of a row is 48 packed bytes, a 384-bit little-endian string of
  6-bit codes (code ``i`` at bit ``6 i``). Thread ``c`` reads the 12 bytes
  ``12c .. 12c+11`` (codes ``16c .. 16c+15``) and gives chunk ``j`` its codes
  ``16c + 4j + (0, 1)`` and ``16c + 4j + (2, 3)``: no shuffle, three aligned
  32-bit shared-memory loads a row, free of bank conflicts (a warp's 32
  words fall in 32 banks). Each such pair of adjacent codes becomes the
  register's two 16-bit floats by ten integer operations
  (:func:`decode_pair`; no conversion, compare or select: the first decode,
  with two conversions a code, left the kernel at a dense matmul's speed).
* **``x`` permuted to match.** Column ``p`` of ``A``'s step holds the code of
  feature :data:`PERMUTATION` ``[p]``, so ``x``'s columns are gathered the same
  way inside each 64-wide block (:func:`permute_features`), one small XLA
  fusion with the padding and the cast at the batch sizes this is for.
* **Tiles.** A program is 2 compute warpgroups of 64 rows of ``W`` each
  (``MatmulConfig.block_n = 128``), ``block_m`` rows of ``x`` (``wgmma``'s N)
  and one of ``split_k`` slabs of ``in``, so that about one program a
  multiprocessor streams ``W`` at small batches
  (:meth:`~jaxnoise.ops.ternary.config.MatmulConfig.wgmma_config`). XLA sums
  the slabs' float32 partial products, scales the rows and transposes.
* **dtypes.** bfloat16 and float16 ``x`` meet ``t`` in their own dtype
  (``t`` is exact in both); float32 ``x`` enters as its three bfloat16 pieces
  (:func:`jaxnoise.ops.ternary.pallas_triton_matmul.bf16_pieces`, stacked
  along the batch), so every product is exact and only the float32 sums
  round, as in a float32 matmul.

Pallas has no interpreter for Mosaic GPU kernels: they run on a Hopper GPU
only, and CI lowers them for CUDA on the CPU and checks the decode's index
math in NumPy (:func:`decode_model`, :func:`decode_pair`). Compiled on an H100
(jax 0.11.2, session 33) the kernel gives exact products at odd shapes in every
dtype; its speed against the Triton paths is in ``benchmarks/RESULTS.md`` and
:meth:`~jaxnoise.ops.ternary.config.MatmulConfig.get_heuristics_config`.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxnoise.ops import _mosaic
from jaxnoise.ops.ternary.config.matmul import WGMMA_BLOCK_NS, WGMMA_STEP, MatmulConfig

__all__ = ["PERMUTATION", "config_reason", "decode_model", "decode_pair", "pair_constants",
           "permute_features", "ternary_matmul", "unsupported_reason"]

STEP = WGMMA_STEP  # features per pipeline step (a row's 48 packed bytes)
STEP_BYTES = 3 * STEP // 4
ROWS = 64  # rows of W per compute warpgroup (MatmulConfig.block_n / ROWS warpgroups a program)
# Pipeline steps whose wgmmas may be in flight while a warpgroup decodes the next step (1: each
# step waits for its own; 2: for the previous step's, the buffers released a step late).
# Session 35 (H100, bf16, device us, 1 against 2): 4096^2 M=16 12.3 / 12.2, M=256 28.8 / 27.7,
# M=1024 89.3 / 85.8; 8192^2 M=16 35.4 / 32.2, M=256 83.2 / 78.3; session 34 M=1 11.7 / 11.4.
STEPS_IN_FLIGHT = 2


def _permutation() -> np.ndarray:
  perm = np.empty(STEP, np.int64)
  for c in range(4):
    for j in range(4):
      for e in range(2):
        perm[16 * j + 2 * c + e] = 16 * c + 4 * j + e          # register tile 2j
        perm[16 * j + 8 + 2 * c + e] = 16 * c + 4 * j + 2 + e  # register tile 2j + 1
  assert sorted(perm) == list(range(STEP))
  return perm


# PERMUTATION[p]: the feature (in a 64-wide block) whose code is A's column p.
PERMUTATION = _permutation()


def permute_features(x: jax.Array) -> jax.Array:
  """``x`` ``(..., in)`` with each 64-wide block's columns in ``A``'s order.

  Example:
    >>> x = jnp.arange(64.0)[None]
    >>> permute_features(x)[0, :4].tolist()  # A's columns 0-3: features 0, 1, 16, 17
    [0.0, 1.0, 16.0, 17.0]
  """
  *lead, n_in = x.shape
  blocks = x.reshape(*lead, n_in // STEP, STEP)
  return blocks[..., PERMUTATION].reshape(*lead, n_in)


def _thread_codes(packed_row_step: np.ndarray, c: int) -> dict[tuple[int, int], tuple[int, int]]:
  """One thread's decode in NumPy: ``(chunk j, tile half) -> (code, code)`` from a row's 48
  bytes of one step, reading only bytes ``12c .. 12c+11`` as three words."""
  words = packed_row_step[12 * c:12 * c + 12].view("<u4").astype(np.uint64)
  bits = int(words[0]) | int(words[1]) << 32 | int(words[2]) << 64
  code = lambda i: (bits >> (6 * i)) & 63
  return {(j, half): (code(4 * j + 2 * half), code(4 * j + 2 * half + 1))
          for j in range(4) for half in range(2)}


def decode_model(packed: np.ndarray) -> np.ndarray:
  """The codes of ``A`` that the kernel's threads assemble, in NumPy (a model of the kernel's
  index math, for tests): ``(out, in)`` codes with each 64-wide block in ``A``'s column order.

  Column ``8 t + 2 c + e`` of register tile ``t`` of a row gets the pair that thread ``c``
  decodes for it, from the three words it reads.
  """
  packed = np.asarray(packed, np.uint8)
  n_out, n_bytes = packed.shape
  steps = n_bytes // STEP_BYTES
  a = np.full((n_out, steps * STEP), -1, np.int64)
  for s in range(steps):
    block = packed[:, s * STEP_BYTES:(s + 1) * STEP_BYTES]
    for r in range(n_out):
      for c in range(4):
        for (j, half), pair in _thread_codes(block[r], c).items():
          for e in range(2):
            a[r, s * STEP + 8 * (2 * j + half) + 2 * c + e] = pair[e]
  return a


# ----------------------------------------------------------------------------
# Eligibility and tiles.


def unsupported_reason(m_rows: int, out_features: int, in_features: int, dtype,
                       interpret: bool = False) -> str | None:
  """Why the kernel cannot run ``(m_rows, in) @ (out, in)^T`` (None if it can)."""
  if interpret or not _mosaic.is_hopper():
    return "needs a Hopper GPU (compute capability 9.x)"
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16),
                              jnp.dtype(jnp.float32)):
    return f"needs bfloat16, float16 or float32 x, got {jnp.dtype(dtype).name}"
  if out_features % WGMMA_BLOCK_NS[0]:
    return f"out = {out_features} is not a multiple of {WGMMA_BLOCK_NS[0]}"
  if in_features % STEP:
    return f"in = {in_features} is not a multiple of {STEP}"
  del m_rows  # any number of rows: padded to the tile
  return None


def config_reason(config: MatmulConfig, out_features: int, in_features: int) -> str | None:
  """Why a ``"wgmma"`` config cannot tile ``(out, in)`` (None if it can)."""
  if out_features % config.block_n:
    return f"block_n = {config.block_n} does not divide out = {out_features}"
  steps = in_features // STEP
  if steps % config.split_k:
    return f"split_k = {config.split_k} does not divide in / {STEP} = {steps}"
  return None


# ----------------------------------------------------------------------------
# The kernel.


# One register of A holds two adjacent codes' ternary values as a pair of 16-bit floats.
# Bits of +1 / -1 without the sign, as a multiple of bit 6 (where a code's flags land).
_ONE_BITS = {jnp.dtype(jnp.bfloat16): 0x3F80, jnp.dtype(jnp.float16): 0x3C00}


def pair_constants(lv: int, dtype) -> tuple[int, int, int]:
  """``(k1, k2, spread)`` of :func:`decode_pair` for codes of ``lv`` levels per value."""
  spread = _ONE_BITS[jnp.dtype(dtype)] >> 6
  return (64 - lv) * 0x10001, (64 - 2 * lv) * 0x10001, spread


def decode_pair(raw, lv: int, dtype, ops=None):
  """Two adjacent 6-bit codes (bits 0-11 of uint32 ``raw``; higher bits ignored) to their
  ternary values as a pair of 16-bit floats in one uint32 (the first code's in the low half).

  Integer operations only, both codes at once in the two 16-bit halves (no conversion,
  compare or select; ten operations a pair):

  * ``v``: code 0 in bits 0-5, code 1 in bits 16-21;
  * ``v + k1`` has bit 6 of a half set iff its code is ``>= lv`` (``t >= 0``), ``v + k2``
    iff it is ``>= 2 lv`` (``t = +1``), with ``k = (64 - bound)`` in each half (no carry:
    a half stays below 128 since ``2 lv <= 42``);
  * the magnitude ``1.0`` is present unless ``t = 0`` (bit 6 of ``~(v + k1) | (v + k2)``),
    spread from bit 6 to the float's bits by one multiply;
  * the sign is ``~(v + k1)``'s bit 6 moved to bit 15 by a shift.

  ``ops`` (default: NumPy-style operators on ``raw``) lets the kernel run the same
  function on MLIR values; this module's tests run it on NumPy arrays.

  Example:
    >>> import numpy as np
    >>> raw = np.uint32(0 | 8 << 6)  # C = 2 (lv = 3): code 0 is -1, code 8 is +1
    >>> hex(int(decode_pair(raw, 3, jnp.bfloat16)))
    '0x3f80bf80'
  """
  k1, k2, spread = pair_constants(lv, dtype)
  if ops is None:
    u32 = lambda value: np.uint32(value)
    ops = dict(const=u32, shl=lambda x, n: x << u32(n), and_=lambda x, y: x & y,
               or_=lambda x, y: x | y, xor=lambda x, y: x ^ y, add=lambda x, y: x + y,
               mul=lambda x, y: x * y)
  c = ops["const"]
  v = ops["or_"](ops["and_"](raw, c(0x3F)), ops["and_"](ops["shl"](raw, 10), c(0x3F0000)))
  at_least_zero = ops["add"](v, c(k1))
  at_least_one = ops["add"](v, c(k2))
  below_zero = ops["xor"](at_least_zero, c(0xFFFFFFFF))
  magnitude = ops["mul"](ops["and_"](ops["or_"](below_zero, at_least_one), c(0x400040)),
                         c(spread))
  sign = ops["and_"](ops["shl"](below_zero, 9), c(0x80008000))
  return ops["or_"](magnitude, sign)


def _decode(lv: int, dtype):
  """The inline Mosaic GPU decode of a warpgroup's ``(64, 48)`` packed bytes to its
  ``(64, 64)`` ternary ``A`` (``dtype``) in the WGMMA register layout."""
  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, vector
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.mosaic.gpu import fragmented_array as fa
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  # pylint: enable=g-import-not-at-top

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                     return_type=plgpu.ShapeDtypeStruct((ROWS, STEP), dtype,
                                                        layout=plgpu.Layout.WGMMA))
  def decode(_, packed_smem):
    i32 = ir.IntegerType.get_signless(32)
    i8 = ir.IntegerType.get_signless(8)
    index = ir.IndexType.get()
    element = (ir.BF16Type.get() if jnp.dtype(dtype) == jnp.dtype(jnp.bfloat16)
               else ir.F16Type.get())
    const = lambda v: arith.constant(i32, ir.IntegerAttr.get(i32, v - (1 << 32) if v >= 1 << 31
                                                             else v))
    ops = dict(const=const, shl=lambda x, n: arith.shli(x, const(n)), and_=arith.andi,
               or_=arith.ori, xor=arith.xori, add=arith.addi, mul=arith.muli)
    tid = mgpu_utils.thread_idx()
    lane = arith.remui(tid, const(32))
    warp = arith.remui(arith.divui(tid, const(32)), const(4))
    c = arith.remui(lane, const(4))
    first_row = arith.addi(arith.muli(warp, const(16)), arith.divui(lane, const(4)))
    byte0 = arith.muli(c, const(12))
    regs = np.empty(fa.WGMMA_LAYOUT.registers_shape((ROWS, STEP)), dtype=object)
    word_type = ir.VectorType.get((4,), i8)
    one_word = ir.VectorType.get((1,), i32)
    pair_type = ir.VectorType.get((2,), element)
    for half in range(2):
      row = arith.index_castui(index, arith.addi(first_row, const(8 * half)))
      words = []
      for w in range(3):
        col = arith.index_castui(index, arith.addi(byte0, const(4 * w)))
        raw = vector.load(word_type, packed_smem, [row, col])
        words.append(vector.extract(vector.bitcast(one_word, raw), dynamic_position=[],
                                    static_position=[0]))

      def pair_bits(first):
        """Bits 0-11: codes ``first`` and ``first + 1`` of the thread's 16."""
        start, shift = divmod(6 * first, 32)
        value = arith.shrui(words[start], const(shift)) if shift else words[start]
        if shift > 20:  # the pair spans two words
          value = arith.ori(value, arith.shli(words[start + 1], const(32 - shift)))
        return value

      for j in range(4):
        for tile_half in range(2):
          bits = decode_pair(pair_bits(4 * j + 2 * tile_half), lv, dtype, ops)
          regs[(0, 2 * j + tile_half, 0, 0, half, 0, 0, 0, 0)] = vector.bitcast(
              pair_type, vector.broadcast(one_word, bits))
    return mgpu.FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

  return decode


def _kernel(packed_gmem, x_gmem, out_gmem, *, lv: int, config: MatmulConfig, dtype):
  """One program: ``block_n`` rows of ``W`` (a warpgroup per 64), ``block_m`` rows of ``x``,
  one slab of ``in``; its ``(block_n, block_m)`` float32 partial product to ``out[split]``."""
  batch, n_in = x_gmem.shape
  splits, batch_tile, block_n = config.split_k, config.block_m, config.block_n
  steps = n_in // STEP // splits
  stages = min(config.num_stages, steps)
  # A step's wgmmas stay in flight while the next step is decoded: its buffers are released
  # a step late (Pallas' delay_release), so the pipeline needs a second buffer.
  delay = min(STEPS_IN_FLIGHT - 1, stages - 1, steps - 1)
  batch_tiles = batch // batch_tile
  program = lax.axis_index("program")
  row_tile, rest = program // (splits * batch_tiles), program % (splits * batch_tiles)
  batch_index, split = rest // splits, rest % splits
  swizzle = plgpu.find_swizzle(STEP * jnp.dtype(dtype).itemsize * 8)
  x_transforms = (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
                  plgpu.SwizzleTransform(swizzle))
  decode = _decode(lv, dtype)
  rows = pl.ds(row_tile * block_n, block_n)
  cols = pl.ds(batch_index * batch_tile, batch_tile)

  def body(_, packed_smem, x_smem, acc):
    wg = lax.axis_index("wg")
    a = decode(packed_smem.at[pl.ds(wg * ROWS, ROWS)])
    plgpu.wgmma(acc, a, x_smem.transpose((1, 0)))
    plgpu.wgmma_wait(delay)
    return acc

  def context(run):
    @functools.partial(pl.run_scoped, acc=plgpu.ACC((ROWS, batch_tile), jnp.float32))
    def _scope(acc):
      run(acc)
      wg = lax.axis_index("wg")
      # Reading the accumulator waits for the last wgmmas.
      out_gmem.at[split, rows, cols].at[pl.ds(wg * ROWS, ROWS)][...] = acc[...]

  pipeline = plgpu.emit_pipeline_warp_specialized(
      body, grid=(steps,), memory_registers=40,
      in_specs=[plgpu.BlockSpec((block_n, STEP_BYTES), lambda k: (0, k),
                                memory_space=plgpu.SMEM, delay_release=delay),
                plgpu.BlockSpec((batch_tile, STEP), lambda k: (0, k), transforms=x_transforms,
                                memory_space=plgpu.SMEM, delay_release=delay)],
      wg_axis="wg", num_compute_wgs=block_n // ROWS, max_concurrent_steps=stages,
      compute_context=context)
  pipeline(packed_gmem.at[rows, pl.ds(split * steps * STEP_BYTES, steps * STEP_BYTES)],
           x_gmem.at[cols, pl.ds(split * steps * STEP, steps * STEP)])


def _unscaled(x16, packed, *, C: int, config: MatmulConfig):
  """``x16 t^T`` in float32, ``(M, out)``, for 16-bit ``x16`` (padded to the batch tile,
  permuted, the slabs summed by XLA)."""
  m_rows = x16.shape[0]
  n_out = packed.shape[0]
  padded = -(-m_rows // config.block_m) * config.block_m
  x_rows = permute_features(jnp.pad(x16, ((0, padded - m_rows), (0, 0))))
  programs = n_out // config.block_n * (padded // config.block_m) * config.split_k
  body = functools.partial(_kernel, lv=2 * C - 1, config=config, dtype=x16.dtype)
  call = _mosaic.kernel(
      body, out_type=jax.ShapeDtypeStruct((config.split_k, n_out, padded), jnp.float32),
      grid=(programs,), grid_names=("program",),
      num_threads=config.block_n // ROWS + 1, thread_name="wg")
  return call(packed, x_rows).sum(0).T[:m_rows]


def ternary_matmul(x, packed, scale, *, C: int, out_dtype: Any, config: MatmulConfig):
  """``(M, in) @ (scale * t)^T -> (M, out)`` for validated inputs that
  :func:`unsupported_reason` and :func:`config_reason` accept.

  float32 ``x`` runs as its three bfloat16 pieces stacked along the rows (``3 M`` rows).
  """
  from jaxnoise.ops.ternary import pallas_triton_matmul  # pylint: disable=g-import-not-at-top
  m_rows = x.shape[0]
  if jnp.dtype(x.dtype) == jnp.dtype(jnp.float32):
    pieces = jnp.concatenate(pallas_triton_matmul.bf16_pieces(x), axis=0)
    y = _unscaled(pieces, packed, C=C, config=config).reshape(3, m_rows, -1).sum(0)
  else:
    y = _unscaled(x, packed, C=C, config=config)
  return (y * scale.astype(jnp.float32)[None, :]).astype(out_dtype)
