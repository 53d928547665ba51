"""Pallas kernel (Mosaic GPU backend, Hopper) of the packed ternary matmul: ``W`` decoded in registers.

``y = x (scale * t)^T`` with ``t`` the ternary values of the packed 6-bit
codes (:func:`jaxnoise.ops.ternary.pack_codes`' layout: 4 codes in 3 bytes
along ``in``). The kernel computes ``y^T = t x^T`` with ``wgmma``: ``A`` is a
warpgroup's 64 rows of ``t``, built in registers from the packed bytes, and
``B`` is ``x^T`` from shared memory. Only the 0.75-byte codes are read from
memory; no dense weight exists anywhere.

* **Which codes a thread decodes.** In the WGMMA register layout each thread
  holds, in register tile ``k`` (0-7) of each of two rows, ``A``'s columns
  ``8k + 2c`` and ``8k + 2c + 1``, ``c = lane % 4``. A 64-deep step of a row is
  48 packed bytes, a 384-bit little-endian string of 6-bit codes (code ``i`` at
  bit ``6 i``), so that pair of codes is the 12 bits from bit ``48 k + 12 c``.
  Every thread of a row loads the row's 48 bytes (three aligned 16-byte
  shared-memory loads, one address per row, free of bank conflicts) and cuts
  pair ``k`` from the 64 bits of two adjacent words by one shift of
  ``12 c`` or ``16 + 12 c`` bits. ``A``'s columns are thus ``x``'s features in
  their own order: ``x`` enters the kernel as it is (session 36: permuting it
  instead, with a thread's own 12 bytes, cost an XLA gather a call, 1.7-7.7 us,
  and the shifts cost nothing, 216 instructions a step against 215). Each pair
  of adjacent codes becomes the register's two 16-bit floats by ten integer
  operations (:func:`decode_pair`; no conversion, compare or select: the first
  decode, with two conversions a code, left the kernel at a dense matmul's
  speed).
* **Tiles.** A program is 2 compute warpgroups of 64 rows of ``W`` each
  (``MatmulConfig.block_n = 128``), ``block_m`` rows of ``x`` (``wgmma``'s N)
  and one of ``split_k`` slabs of ``in``, so that about one program a
  multiprocessor streams ``W`` at small batches
  (:meth:`~jaxnoise.ops.ternary.config.MatmulConfig.wgmma_config`).
* **Overlap.** A ``wgmma`` reads ``A`` from registers, which must not change
  until a ``wgmma.wait_group`` covers it. With ``MatmulConfig.substeps = 2`` a
  pipeline buffer holds two 64-deep steps and ``A`` alternates between two
  register sets, so one set's decode overlaps the other's ``wgmma`` (the
  heuristic's choice up to 16-row tiles: 8-11% faster there on an H100).
* **Epilogue.** For 16-bit ``x`` in one slab the kernel gives ``y`` itself
  (:func:`reduces_in_kernel`): it scales the accumulator's rows (``scale``
  read in the accumulator's row layout), casts to the output dtype and stores
  ``y``'s ``(block_m, 64)`` tile from registers. Each thread's pairs run along
  ``W``'s rows (``WGMMA_TRANSPOSED``, one shuffle a register), so a warp's
  stores fill whole 32-byte sectors of ``y``. With :data:`REDUCE_IN_CLUSTER`
  (off by default: correct on an H100, but slower) the ``split_k`` programs of a
  tile form a cluster: each leaves its float32 partial product in its shared
  memory, and the first sums the others' through distributed shared memory
  before the same epilogue. Otherwise, and for float32 ``x``, the partial
  products go out as ``y^T`` and one XLA fusion sums them, scales the rows and
  transposes.
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

__all__ = ["config_reason", "decode_model", "decode_pair", "pair_constants",
           "cluster_partials_fit", "reduces_in_kernel", "ternary_matmul", "tma_can_pad",
           "unsupported_reason"]

STEP = WGMMA_STEP  # features per pipeline step (a row's 48 packed bytes)
STEP_BYTES = 3 * STEP // 4
ROWS = 64  # rows of W per compute warpgroup (MatmulConfig.block_n / ROWS warpgroups a program)
# Pipeline steps whose wgmmas may be in flight while a warpgroup decodes the next step (1: each
# step waits for its own; 2: for the previous step's, the buffers released a step late).
# Session 35 (H100, bf16, device us, 1 against 2): 4096^2 M=16 12.3 / 12.2, M=256 28.8 / 27.7,
# M=1024 89.3 / 85.8; 8192^2 M=16 35.4 / 32.2, M=256 83.2 / 78.3; session 34 M=1 11.7 / 11.4.
# But 2 is undefined behaviour in PTX: the next step's decode writes the registers of A (the
# same virtual registers, in a loop) while the last wgmma may still read them. Session 36:
# ptxas put the next step's shared-memory loads in those registers, and 256-row tiles gave NaN
# (16-row tiles' short wgmmas finished first). So 1; the legal overlap is MatmulConfig.substeps
# = 2 (A alternates between two register sets; the heuristic's choice up to 16-row tiles).
STEPS_IN_FLIGHT = 1
# Slabs of ``in`` summed in the kernel, through a cluster's distributed shared memory (else
# XLA sums their float32 partial products, scales and transposes: a second kernel, 1.5-4 us).
# Correct on an H100 (session 37: the exact-product tests passed under jax 0.11.2) but slower:
# bf16, device us, against XLA's sum: 4096^2 M=16 20.4 against 10.6, M=4 22.2 against 13.5;
# 8192^2 M=16 32.1 against 33.4, M=8 31.2 against 33.1, M=1 34.0 against 34.4. So off.
REDUCE_IN_CLUSTER = False
MAX_CLUSTER = 8  # the portable cluster size
# x enters as it is when its rows are not a multiple of the batch tile (but fewer than 8 or a
# multiple of 8, as x's tiling in shared memory needs): the last tile's TMA reads past x's
# last row (rows the hardware fills with zeros, whose columns of y are cut off anyway), where
# otherwise XLA pads x first (a kernel of its own, 1.5 us at 1-4 rows on an H100, session
# 37). Off until compiled on a GPU.
TMA_PADS_ROWS = False
_SHARED_MEMORY_SLACK = 2048  # the pipeline's barriers and alignment


def _thread_codes(packed_row_step: np.ndarray, c: int) -> dict[int, tuple[int, int]]:
  """One thread's decode in NumPy: ``register tile k -> (code, code)`` from a row's 48 bytes of
  one step, read as twelve words, each pair cut from two adjacent words as the kernel does."""
  words = [int(w) for w in packed_row_step.view("<u4")]
  pairs = {}
  for k in range(8):
    first, offset = divmod(48 * k, 32)
    window = words[first] | words[first + 1] << 32
    bits = window >> (offset + 12 * c)
    pairs[k] = (bits & 63, bits >> 6 & 63)
  return pairs


def decode_model(packed: np.ndarray) -> np.ndarray:
  """The codes of ``A`` that the kernel's threads assemble, in NumPy (a model of the kernel's
  index math, for tests): ``(out, in)`` codes in ``A``'s column order.

  Column ``8 k + 2 c + e`` (register tile ``k``) of a row gets the pair that thread ``c``
  cuts for it from the row's words.
  """
  packed = np.asarray(packed, np.uint8)
  n_out, n_bytes = packed.shape
  steps = n_bytes // STEP_BYTES
  a = np.full((n_out, steps * STEP), -1, np.int64)
  for s in range(steps):
    block = packed[:, s * STEP_BYTES:(s + 1) * STEP_BYTES]
    for r in range(n_out):
      for c in range(4):
        for k, pair in _thread_codes(block[r], c).items():
          for e in range(2):
            a[r, s * STEP + 8 * k + 2 * c + e] = pair[e]
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
  if steps // config.split_k % config.substeps:
    return (f"a slab's {steps // config.split_k} steps of {STEP} inputs are not a multiple of "
            f"substeps = {config.substeps}")
  return None


def tma_can_pad(m_rows: int) -> bool:
  """Whether ``x`` of ``m_rows`` rows can enter unpadded (:data:`TMA_PADS_ROWS`): its 8-row
  tiling in shared memory takes fewer rows than 8 or a multiple of 8.

  Example:
    >>> [tma_can_pad(m) for m in (4, 13, 24)]
    [True, False, True]
  """
  return m_rows < 8 or m_rows % 8 == 0


def reduces_in_kernel(config: MatmulConfig, dtype) -> bool:
  """Whether the kernel gives ``y`` itself (scaled, cast, its slabs summed), with no XLA
  epilogue: 16-bit ``x``, and one slab or (with :data:`REDUCE_IN_CLUSTER`) a cluster of at
  most :data:`MAX_CLUSTER` slabs whose partial products fit (:func:`cluster_partials_fit`).

  Example:
    >>> reduces_in_kernel(MatmulConfig.wgmma_config((1024, 4096, 4096)), jnp.bfloat16)
    True
    >>> reduces_in_kernel(MatmulConfig.wgmma_config((1024, 4096, 4096)), jnp.float32)
    False
  """
  if jnp.dtype(dtype).itemsize != 2:
    return False
  return config.split_k == 1 or (REDUCE_IN_CLUSTER and cluster_partials_fit(config))


def cluster_partials_fit(config: MatmulConfig) -> bool:
  """Whether ``config``'s slabs (16-bit ``x``) can be summed in a cluster: at most
  :data:`MAX_CLUSTER` of them, their float32 partial products beside the pipeline's buffers
  in one program's shared memory.

  Example:
    >>> cluster_partials_fit(MatmulConfig.wgmma_config((16, 4096, 4096)))
    True
  """
  if config.split_k > MAX_CLUSTER:
    return False
  step_bytes = config.block_n * STEP_BYTES + config.block_m * STEP * 2
  pipeline = config.num_stages * config.substeps * step_bytes
  partials = config.block_n * config.block_m * 4
  return pipeline + partials <= _mosaic.SHARED_MEMORY_BYTES - _SHARED_MEMORY_SLACK


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


def _thread_place(const):
  """``(first_row, c)`` of this thread in a warpgroup's WGMMA register layout: it holds rows
  ``first_row`` and ``first_row + 8`` and, in each 8-wide column tile, columns ``2c, 2c+1``
  (``const(v)``: an int32 constant)."""
  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir.dialects import arith
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  # pylint: enable=g-import-not-at-top
  tid = mgpu_utils.thread_idx()
  lane = arith.remui(tid, const(32))
  warp = arith.remui(arith.divui(tid, const(32)), const(4))
  first_row = arith.addi(arith.muli(warp, const(16)), arith.divui(lane, const(4)))
  return first_row, arith.remui(lane, const(4))


def _decode(lv: int, dtype):
  """The inline Mosaic GPU decode of a warpgroup's ``(64, 48)`` packed bytes to its
  ``(64, 64)`` ternary ``A`` (``dtype``) in the WGMMA register layout."""
  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, vector
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.mosaic.gpu import fragmented_array as fa
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
    first_row, c = _thread_place(const)
    regs = np.empty(fa.WGMMA_LAYOUT.registers_shape((ROWS, STEP)), dtype=object)
    i64 = ir.IntegerType.get_signless(64)
    quad_bytes = ir.VectorType.get((16,), i8)
    quad_words = ir.VectorType.get((4,), i32)
    pair_type = ir.VectorType.get((2,), element)
    one_word = ir.VectorType.get((1,), i32)
    wide = lambda value: arith.extui(i64, value)
    # Field k (k = 2 j + tile half) of the thread's row starts at bit 48 k + 12 c: a shift of
    # 12 c (even k) or 16 + 12 c (odd k) within the 64 bits of words k * 3 // 2 and the next.
    shifts = [wide(arith.addi(arith.muli(c, const(12)), const(16 * odd))) for odd in (0, 1)]
    for half in range(2):
      row = arith.index_castui(index, arith.addi(first_row, const(8 * half)))
      words = []
      for q in range(3):  # the row's 48 bytes, three aligned 16-byte loads
        col = arith.constant(index, ir.IntegerAttr.get(index, 16 * q))
        raw = vector.bitcast(quad_words, vector.load(quad_bytes, packed_smem, [row, col]))
        words += [vector.extract(raw, dynamic_position=[], static_position=[e])
                  for e in range(4)]
      for k in range(8):
        first = 48 * k // 32
        window = arith.ori(wide(words[first]),
                           arith.shli(wide(words[first + 1]), arith.constant(
                               i64, ir.IntegerAttr.get(i64, 32))))
        pair = arith.trunci(i32, arith.shrui(window, shifts[k % 2]))
        bits = decode_pair(pair, lv, dtype, ops)
        regs[(0, k, 0, 0, half, 0, 0, 0, 0)] = vector.bitcast(
            pair_type, vector.broadcast(one_word, bits))
    return mgpu.FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

  return decode


def _kernel(packed_gmem, x_gmem, *refs, lv: int, config: MatmulConfig, dtype):
  """One program: ``block_n`` rows of ``W`` (a warpgroup per 64), ``block_m`` rows of ``x``,
  one slab of ``in``.

  ``refs`` is ``(out,)``: the ``(block_n, block_m)`` float32 partial product to
  ``out[split]``; or ``(scale, out)``: ``y``'s ``(block_m, block_n)`` tile itself, scaled,
  cast to ``out``'s dtype and stored transposed, its slabs (a cluster of programs) summed
  through the first program's shared memory (:func:`_reduce_in_cluster`).
  """
  scale_gmem, out_gmem = refs if len(refs) == 2 else (None, *refs)
  batch, n_in = x_gmem.shape
  splits, batch_tile, block_n = config.split_k, config.block_m, config.block_n
  substeps = config.substeps
  steps = n_in // (STEP * substeps) // splits
  stages = min(config.num_stages, steps)
  # A step's wgmmas stay in flight while the next step is decoded: its buffers are released
  # a step late (Pallas' delay_release), so the pipeline needs a second buffer.
  in_flight = 2 if substeps == 2 else STEPS_IN_FLIGHT
  delay = min(in_flight - 1, stages - 1, steps - 1)
  batch_tiles = -(-batch // batch_tile)  # x unpadded (TMA_PADS_ROWS): a ragged last tile
  program = lax.axis_index("program")
  if scale_gmem is None:
    row_tile, rest = program // (splits * batch_tiles), program % (splits * batch_tiles)
    batch_index, split = rest // splits, rest % splits
  else:  # a cluster a tile, a program a slab
    row_tile, batch_index = program // batch_tiles, program % batch_tiles
    split = lax.axis_index("split")
  swizzle = plgpu.find_swizzle(STEP * jnp.dtype(dtype).itemsize * 8)
  x_transforms = (plgpu.TilingTransform((8, swizzle // jnp.dtype(dtype).itemsize)),
                  plgpu.SwizzleTransform(swizzle))
  decode = _decode(lv, dtype)
  rows = pl.ds(row_tile * block_n, block_n)
  cols = pl.ds(batch_index * batch_tile, batch_tile)

  def body(_, packed_smem, x_smem, acc):
    wg = lax.axis_index("wg")
    if substeps == 1:
      a = decode(packed_smem.at[pl.ds(wg * ROWS, ROWS)])
      plgpu.wgmma(acc, a, x_smem.transpose((1, 0)))
      plgpu.wgmma_wait(delay)
      return acc
    for sub in range(substeps):  # A's two register sets: a wgmma waits for the other set's
      a = decode(packed_smem.at[pl.ds(wg * ROWS, ROWS), pl.ds(sub * STEP_BYTES, STEP_BYTES)])
      plgpu.wgmma(acc, a, x_smem.at[:, pl.ds(sub * STEP, STEP)].transpose((1, 0)))
      # The stage's last wgmma stays in flight only if its buffers are released late.
      plgpu.wgmma_wait(1 if sub < substeps - 1 else delay)
    return acc

  def store_y(y_t, wg_rows):
    """Scales ``y^T``'s rows, casts and stores them as ``y``'s columns."""
    scale = _mosaic.load_rows(scale_gmem.at[wg_rows])
    y_t = (y_t * lax.broadcast_in_dim(scale, (ROWS, batch_tile), [0])).astype(out_gmem.dtype)
    # Each thread's pairs along W's rows: adjacent in y's rows, so that a warp's stores fill
    # whole 32-byte sectors.
    out_gmem.at[cols, wg_rows].transpose((1, 0))[...] = plgpu.layout_cast(
        y_t, plgpu.Layout.WGMMA_TRANSPOSED)

  def context(run, partials_smem=None, barriers=None):
    @functools.partial(pl.run_scoped, acc=plgpu.ACC((ROWS, batch_tile), jnp.float32))
    def _scope(acc):
      run(acc)
      wg = lax.axis_index("wg")
      wg_rows = pl.ds(row_tile * block_n + wg * ROWS, ROWS)
      # Reading the accumulator waits for the last wgmmas.
      if scale_gmem is None:
        out_gmem.at[split, wg_rows, cols][...] = acc[...]
      elif splits == 1:
        store_y(acc[...], wg_rows)
      else:
        _reduce_in_cluster(acc[...], partials_smem, barriers, splits,
                           functools.partial(store_y, wg_rows=wg_rows))

  def run_pipeline(partials_smem=None, barriers=None):
    pipeline = plgpu.emit_pipeline_warp_specialized(
        body, grid=(steps,), memory_registers=40,
        in_specs=[plgpu.BlockSpec((block_n, STEP_BYTES * substeps), lambda k: (0, k),
                                  memory_space=plgpu.SMEM, delay_release=delay),
                  plgpu.BlockSpec((batch_tile, STEP * substeps), lambda k: (0, k),
                                  transforms=x_transforms, memory_space=plgpu.SMEM,
                                  delay_release=delay)],
        wg_axis="wg", num_compute_wgs=block_n // ROWS, max_concurrent_steps=stages,
        compute_context=functools.partial(context, partials_smem=partials_smem,
                                          barriers=barriers))
    slab = steps * substeps
    pipeline(packed_gmem.at[rows, pl.ds(split * slab * STEP_BYTES, slab * STEP_BYTES)],
             x_gmem.at[cols, pl.ds(split * slab * STEP, slab * STEP)])

  if scale_gmem is None or splits == 1:
    run_pipeline()
  else:
    pl.run_scoped(
        run_pipeline,
        partials_smem=plgpu.SMEM((block_n // ROWS, ROWS, batch_tile), jnp.float32),
        barriers=plgpu.ClusterBarrier(collective_axes=("split",), num_barriers=2,
                                      num_arrivals=block_n // ROWS),
        collective_axes="wg")


def _reduce_in_cluster(partial, partials_smem, barriers, splits: int, store):
  """Sums a warpgroup's float32 ``partial`` over its cluster's ``splits`` programs (one a
  slab of ``in``) and ``store``s the sum from the first: every program leaves its partial in
  its shared memory; the first reads the others' (distributed shared memory) once all have
  arrived, and all wait until it has read them before they exit."""
  wg = lax.axis_index("wg")
  partials_smem[wg] = partial
  # The barriers' arrivals order at the scope of one program: fences order the partials'
  # stores and the first program's loads at the cluster's.
  _cluster_fence()
  plgpu.barrier_arrive(barriers.at[0])
  plgpu.barrier_wait(barriers.at[0])
  _cluster_fence()

  @pl.when(lax.axis_index("split") == 0)
  def _first():
    total = partial
    for peer in range(1, splits):
      total = total + _load_peer_tile(partials_smem.at[wg], peer)
    store(total)

  plgpu.barrier_arrive(barriers.at[1])
  plgpu.barrier_wait(barriers.at[1])


def _load_peer_tile(partial_smem, peer: int) -> jax.Array:
  """Program ``peer``'s copy of the ``(64, batch_tile)`` float32 ``partial_smem`` (row-major,
  in its shared memory), loaded through distributed shared memory in the accumulator's layout.

  Each thread loads its registers' pairs (``ld.shared::cluster``) from the address that
  ``mapa`` gives for the peer. (``plgpu.cluster_ref`` does this in jax 0.10 but fails to
  lower in jax 0.11.2, whose memref view of the mapped address has no conversion.)
  """
  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import arith, llvm, nvvm
  from jax.experimental.mosaic import gpu as mgpu
  from jax.experimental.mosaic.gpu import fragmented_array as fa
  from jax.experimental.mosaic.gpu import utils as mgpu_utils
  # pylint: enable=g-import-not-at-top
  cols = partial_smem.shape[-1]

  @plgpu.inline_mgpu(arg_types=(plgpu.RefType(),),
                     return_type=plgpu.ShapeDtypeStruct((ROWS, cols), jnp.float32,
                                                        layout=plgpu.Layout.WGMMA))
  def load(_, ref):
    i32 = ir.IntegerType.get_signless(32)
    f32 = ir.F32Type.get()
    const = lambda v: arith.constant(i32, ir.IntegerAttr.get(i32, v))
    remote = nvvm.mapa(llvm.PointerType.get(7), mgpu_utils.memref_ptr(ref), const(peer))
    first_row, c = _thread_place(const)
    first = arith.addi(arith.muli(first_row, const(cols)), arith.muli(c, const(2)))
    pair = ir.VectorType.get((2,), f32)
    regs = np.empty(fa.WGMMA_LAYOUT.registers_shape((ROWS, cols)), dtype=object)
    for tile in range(cols // 8):  # columns 8 tile + 2 c + (0, 1)
      for half in range(2):  # rows first_row + 8 half
        at = arith.addi(first, const(8 * half * cols + 8 * tile))
        regs[(0, tile, 0, 0, half, 0, 0, 0, 0)] = llvm.load(
            pair, mgpu_utils.getelementptr(remote, [at], f32), alignment=8)
    return mgpu.FragmentedArray(_registers=regs, _layout=fa.WGMMA_LAYOUT, _is_signed=None)

  return load(partial_smem)


def _cluster_fence():
  """``fence.acq_rel.cluster`` in every thread of the warpgroup."""
  # pylint: disable=g-import-not-at-top
  from jax._src.lib.mlir import ir
  from jax._src.lib.mlir.dialects import llvm
  # pylint: enable=g-import-not-at-top

  @plgpu.inline_mgpu()
  def fence(_):
    llvm.inline_asm(ir.Type.parse("!llvm.void"), [], "fence.acq_rel.cluster;", "",
                    has_side_effects=True)

  fence()


def _call(x16, packed, scale=None, *, C: int, config: MatmulConfig, out_dtype: Any = None):
  """The kernel on 16-bit ``x16`` padded to the batch tile: ``y`` ``(M, out)`` in
  ``out_dtype`` if ``scale`` is given, else the unscaled ``x16 t^T`` in float32, its slabs
  summed by XLA."""
  m_rows = x16.shape[0]
  n_out = packed.shape[0]
  padded = -(-m_rows // config.block_m) * config.block_m
  tma_pads = TMA_PADS_ROWS and tma_can_pad(m_rows)
  x_rows = x16 if tma_pads or padded == m_rows else jnp.pad(x16, ((0, padded - m_rows), (0, 0)))
  tiles = n_out // config.block_n * (padded // config.block_m)
  body = functools.partial(_kernel, lv=2 * C - 1, config=config, dtype=x16.dtype)
  kernel = functools.partial(_mosaic.kernel, body, grid_names=("program",),
                             num_threads=config.block_n // ROWS + 1, thread_name="wg")
  if scale is not None:
    call = kernel(out_type=jax.ShapeDtypeStruct((padded, n_out), out_dtype), grid=(tiles,),
                  cluster=(config.split_k,), cluster_names=("split",))
    return call(packed, x_rows, scale.astype(jnp.float32))[:m_rows]
  call = kernel(out_type=jax.ShapeDtypeStruct((config.split_k, n_out, padded), jnp.float32),
                grid=(tiles * config.split_k,))
  # The pad's rows cut before the sum: XLA then fuses the sum, transpose, scale and cast into
  # one kernel (cut after the transpose, the cast was a kernel of its own: 1.5 us at 4 rows).
  return call(packed, x_rows)[:, :, :m_rows].sum(0).T


def ternary_matmul(x, packed, scale, *, C: int, out_dtype: Any, config: MatmulConfig):
  """``(M, in) @ (scale * t)^T -> (M, out)`` for validated inputs that
  :func:`unsupported_reason` and :func:`config_reason` accept.

  float32 ``x`` runs as its three bfloat16 pieces stacked along the rows (``3 M`` rows).
  """
  from jaxnoise.ops.ternary import pallas_triton_matmul  # pylint: disable=g-import-not-at-top
  m_rows = x.shape[0]
  if jnp.dtype(x.dtype) == jnp.dtype(jnp.float32):
    pieces = jnp.concatenate(pallas_triton_matmul.bf16_pieces(x), axis=0)
    y = _call(pieces, packed, C=C, config=config)
    y = y.reshape(3, m_rows, -1).sum(0)
  elif reduces_in_kernel(config, x.dtype):  # the kernel scales, casts and stores y itself
    return _call(x, packed, scale, C=C, config=config, out_dtype=out_dtype)
  else:
    y = _call(x, packed, C=C, config=config)
  return (y * scale.astype(jnp.float32)[None, :]).astype(out_dtype)
