"""Tiling of the packed ternary matmul and its input gradient: :class:`MatmulConfig`, and
their autotuning keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from jaxnoise.ops.ternary.config._common import _check_pow2, _check_warps_stages, next_power_of_2

__all__ = ["DECODE_TARGETS", "MATMUL_METHODS", "MatmulConfig", "matmul_input_grad_key",
           "matmul_key"]


MATMUL_METHODS = ("dot", "fma", "decode", "wgmma")
# What the "decode" method writes for XLA's GEMM: the compute dtype. Two ternary values
# per byte (int4, converted inside the GEMM) were a target until 2026-12-03: XLA's GEMM
# with an int4 operand returned wrong values on an H200 (jax 0.11.2), depending on the
# tiling its autotuner picked (``benchmarks/check_int4_gemm.py``).
DECODE_TARGETS = ("compute",)
# Programs the small-batch heuristic aims for: a few per SM of a large GPU (132 on an H200).
_GEMV_PROGRAMS = 512
# One row of 16-bit x: whole-row programs (MatmulConfig._gemv_config), about this many of
# them (output units per program: out / this, 2 to 16).
_WHOLE_ROW_PROGRAMS = 2048
# ... from this many outputs (~1024 programs of 2 units); fewer split `in` for enough programs.
_GEMV_MIN_OUT = 2048
# The forward's 16-row joined dot tiles (MatmulConfig._dot_tiles): ~this many programs.
_DOT_PROGRAMS = 1024
# The input gradient's small-M dot tiles: programs along (rows, inputs, out slabs).
_INPUT_GRAD_PROGRAMS = 256
# "wgmma" (the Mosaic GPU kernel, Hopper): rows of W per program, inputs per step, the widest
# batch tile (wgmma's N) and the split's aim: about one program a multiprocessor (fewer,
# longer programs measured faster: MatmulConfig.wgmma_config), each slab keeping at least
# _WGMMA_MIN_STEPS steps.
# * Two compute warpgroups of 64 rows. Four (block_n = 256) hung on an H100 in session 34: at
#   640 threads ptxas gives 96 registers, and the memory warpgroup's hand-over to 40 frees
#   fewer than Pallas' compute warpgroups ask for to reach 112, so their setmaxnreg.inc most
#   likely never returns.
# * Batch tiles up to wgmma's 256 rows. Session 35 (H100, bf16, device us, with a step in
#   flight): 256-row tiles against 128 at the same number of programs, 4096^2 M=256 28.0
#   against 27.7, M=1024 66.4 against 85.8; 8192^2 M=256 66.9 against 78.3.
WGMMA_BLOCK_NS = (128,)
WGMMA_BLOCK_N = WGMMA_BLOCK_NS[0]
WGMMA_STEP = 64
WGMMA_MAX_BLOCK_M = 256
WGMMA_SUBSTEPS = (1, 2)
# The heuristic's batch tiles (rows) up to which a buffer holds two 64-deep steps (substeps=2)
# at half the buffers. Session 37 (H100, bf16, device us, against one step a buffer): 4096^2
# M=16 9.8 against 10.6 (kernel 8.35 / 9.1), M=4 12.3 / 13.5; 8192^2 M=16 29.6 / 33.4, M=8
# 28.9 / 33.1, M=1 30.2 / 34.4; but M=1024 (256-row tiles, 4 buffers against 2) 79.4 against
# 55.8 at 4096^2 and 296.2 against 197.9 at 8192^2.
_WGMMA_SUBSTEPS_MAX_BLOCK_M = 16
_WGMMA_HEURISTIC_MAX_BLOCK_M = 256  # the heuristic's widest batch tile
_WGMMA_PROGRAMS = 128
_WGMMA_MIN_STEPS = 8
# Fields of MatmulConfig that the "wgmma" kernel does not read (they must keep their defaults).
_WGMMA_UNUSED_FIELDS = ("num_warps", "allow_tf32", "word_loads", "x_vector_loads", "decode_to",
                        "split_float32", "interleave_lanes", "weights_lhs", "register_prefetch")


# Rows of x (inclusive ranges, by x's itemsize) for which the heuristic takes the "wgmma"
# kernel where it can run: where it measured faster than the Triton paths
# (MatmulConfig.get_heuristics_config). Outside them, or with None, it is opt-in
# (MatmulConfig.wgmma_config). 16-bit x (H100, device us, 4096^2 / 8192^2): session 33 at
# 32-128 rows; session 35 at 16 rows 12.2 / 32.2 against the Triton dot tiles' 13.4 / 40.1,
# and at 256 rows 28.0 / 66.9 against decode-then-matmul's 34.8 / 128.5. Session 36 (x in
# its own order, the kernel's own epilogue at one slab, one step in flight): at 1024 rows
# 55.5 against decode-then-matmul's 62.2 at 4096^2 (8192^2 not measured); at 256 rows 25.7 /
# 63.8 against 34.6 / 125.8. At 4 rows the Triton tiles stay (session 33: 13.2 / 38.5 against
# 16.8 / 41.2).
WGMMA_DEFAULT_ROWS: dict[int, tuple[int, int]] | None = {2: (16, 1024), 4: (4, 32)}


def _prefers_wgmma(m_rows: int, itemsize: int) -> bool:
  """Whether the heuristic takes the ``"wgmma"`` kernel (where it can run) at ``M`` rows."""
  rows = (WGMMA_DEFAULT_ROWS or {}).get(min(itemsize, 4))
  return rows is not None and rows[0] <= m_rows <= rows[1]


def _gemv_split_k(out_features: int, in_features: int, block_n: int, block_groups: int,
                  programs: int = _GEMV_PROGRAMS) -> int:
  """``split_k`` for one row tile: ~``programs`` programs, at most one per step."""
  steps = max(1, -(-max(1, in_features // 4) // block_groups))
  n_blocks = -(-out_features // block_n)
  return min(steps, next_power_of_2(max(1, programs // n_blocks)))


@dataclasses.dataclass(frozen=True)
class MatmulConfig:
  """Tiling of the packed ternary matmul and its input gradient.

  Attributes:
    block_m: rows of ``x`` per tile (>= 16 for ``method="dot"``).
    block_n: output units per tile (>= 16 for ``"dot"``); in the
      input-gradient kernel, the chunk of output units reduced per step.
    block_groups: groups (4 inputs each) per step of the ``in`` reduction; in
      the input-gradient kernel, the groups per output tile (>= 16 there).
    num_warps: Triton warps per program.
    num_stages: software-pipelining depth of the reduction loop.
    allow_tf32: let float32 inputs use TF32 tensor cores (codes are exact in
      any dtype; only ``x`` is rounded). False keeps float32 products exact.
    split_k: programs along ``in`` (each reduces a slab; XLA adds the float32
      partial tiles). More programs for small ``M``. In the input-gradient
      kernel, programs along ``out`` (its reduction).
    method: ``"dot"`` (tensor-core tiles), ``"fma"`` (CUDA-core tiles, for one
      to three rows of ``x``), ``"decode"`` (decode ``t`` densely, then an XLA
      GEMM: a temporary ``out x in`` matrix, for large ``M``) or ``"wgmma"``
      (Hopper only: the Mosaic GPU kernel of
      :mod:`jaxnoise.ops.ternary.mosaic_gpu_matmul`, ``t`` decoded in
      registers as ``wgmma``'s left operand; ``block_n = 128`` rows
      of ``W`` (two warpgroups), ``block_groups = 16``, ``block_m``
      the batch tile of 8 to 256 rows,
      ``num_stages`` its pipeline buffers, ``split_k`` slabs of ``in``,
      ``substeps`` 64-deep steps a buffer; the other fields must keep their
      defaults). The input gradient runs ``"dot"`` or
      ``"decode"`` (an ``"fma"`` or ``"wgmma"`` config there means its
      heuristic).
    word_loads: read the codes as uint32 words (three per 16 codes) when
      ``in % 16 == 0`` and ``block_groups >= 4`` (``>= 64`` for ``"dot"``);
      else three bytes per 4.
    x_vector_loads: ``"fma"`` tiles read ``x`` in 16-byte vectors of
      consecutive lanes and split them in registers (False: one strided load
      per lane, which kept the H200's L1 the busiest unit at one row).
    decode_to: what ``"decode"`` writes for XLA's GEMM (one of
      :data:`DECODE_TARGETS`): ``"compute"`` (the compute dtype).
    split_float32: a float32 operand of a dot (float32 ``x``; in the input
      gradient, float32 ``grad_y * scale``) meets the codes on bfloat16
      tensor cores as three pieces whose float32 sum is the operand exactly
      (:func:`jaxnoise.ops.ternary.pallas_triton_matmul.bf16_pieces`).
      ``t`` is exact in bfloat16, so every product is exact and only the
      float32 sums round, as in a float32 dot. Used by the dot tiles and the
      decode method's XLA GEMM unless ``allow_tf32``. False: float32 dots
      (CUDA cores when exact).
    interleave_lanes: ``"dot"`` tiles join a step's code lanes into one
      ``(block_n, 4 * block_groups)`` tile of ``t`` in ``x``'s column order
      (a tree of ``tt.join``, no data moved) and take one dot per step on
      ``x`` as it is; False: one dot per code lane on ``x`` transposed to the
      codes' lane order by XLA before the kernel.
    weights_lhs: with ``interleave_lanes``, ``t`` is the dot's left operand
      and the tile is formed transposed, ``(block_n, block_m)`` (on Hopper a
      warpgroup MMA can read a left operand from registers).
    register_prefetch: ``"dot"`` tiles issue the next step's loads (codes and
      ``x``) before the current step's decode and dot and carry them in
      registers: a two-step software pipeline without shared memory, for
      ``num_stages=1`` (Triton's own pipeline off).
    substeps: ``"wgmma"`` only (1 elsewhere): 64-deep steps per pipeline
      buffer, 1 or 2. With 2 the decoded ``A`` alternates between two
      register sets, so one step's decode overlaps the other's ``wgmma``
      (each ``wgmma`` waits for the one before it, whose registers the next
      decode writes); a slab's steps must be even.
  """

  block_m: int = 64
  block_n: int = 64
  block_groups: int = 16
  num_warps: int = 4
  num_stages: int = 3
  allow_tf32: bool = False
  split_k: int = 1
  method: str = "dot"
  word_loads: bool = True
  x_vector_loads: bool = True
  decode_to: str = "compute"
  split_float32: bool = True
  interleave_lanes: bool = False
  weights_lhs: bool = False
  register_prefetch: bool = False
  substeps: int = 1

  def __post_init__(self):
    _check_pow2(self, ("block_m", "block_n", "block_groups"))
    if self.decode_to == "int4":
      raise ValueError(
          "MatmulConfig.decode_to='int4' was removed: XLA's GEMM with an int4 operand gave "
          "wrong values on an H200 (jax 0.11.2; benchmarks/check_int4_gemm.py). Use "
          "decode_to='compute'.")
    if self.decode_to not in DECODE_TARGETS:
      raise ValueError(f"MatmulConfig.decode_to must be one of {DECODE_TARGETS}, "
                       f"got {self.decode_to!r}")
    _check_warps_stages(self)
    if self.method not in MATMUL_METHODS:
      raise ValueError(f"MatmulConfig.method must be one of {MATMUL_METHODS}, "
                       f"got {self.method!r}")
    if self.method == "wgmma":
      if self.block_n not in WGMMA_BLOCK_NS or self.block_groups != WGMMA_STEP // 4:
        raise ValueError(f"MatmulConfig with method='wgmma' needs block_n in {WGMMA_BLOCK_NS} "
                         f"and block_groups={WGMMA_STEP // 4}, got block_n={self.block_n}, "
                         f"block_groups={self.block_groups}")
      unused = [f.name for f in dataclasses.fields(self)
                if f.name in _WGMMA_UNUSED_FIELDS and getattr(self, f.name) != f.default]
      if unused:
        raise ValueError(f"MatmulConfig with method='wgmma' does not use {', '.join(unused)}; "
                         f"leave them at their defaults (float32 x always runs as exact "
                         f"bfloat16 pieces)")
      if self.substeps not in WGMMA_SUBSTEPS or isinstance(self.substeps, bool):
        raise ValueError(f"MatmulConfig.substeps must be one of {WGMMA_SUBSTEPS} for "
                         f"method='wgmma', got {self.substeps!r}")
      if not 8 <= self.block_m <= WGMMA_MAX_BLOCK_M:
        raise ValueError(f"MatmulConfig.block_m must be in [8, {WGMMA_MAX_BLOCK_M}] for "
                         f"method='wgmma' (wgmma's N), got {self.block_m}")
    elif self.substeps != 1:
      raise ValueError(f"MatmulConfig.substeps is read by method='wgmma' only; leave it at 1 "
                       f"for method={self.method!r}, got {self.substeps!r}")
    if self.method == "dot":
      for name in ("block_m", "block_n"):
        if getattr(self, name) < 16:
          raise ValueError(f"MatmulConfig.{name} must be >= 16 (Triton dot tiles), "
                           f"got {getattr(self, name)}")
      if self.block_groups < 16:
        raise ValueError(f"MatmulConfig.block_groups must be >= 16 for method='dot' (each "
                         f"code lane's dot contracts >= 16 units), got {self.block_groups}")
    if (not isinstance(self.split_k, int) or isinstance(self.split_k, bool)
        or self.split_k < 1):
      raise ValueError(f"MatmulConfig.split_k must be a positive int, got {self.split_k!r}")
    for name in ("allow_tf32", "word_loads", "x_vector_loads", "split_float32",
                 "interleave_lanes", "weights_lhs", "register_prefetch"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"MatmulConfig.{name} must be a bool, got {getattr(self, name)!r}")
    if self.weights_lhs and not self.interleave_lanes:
      raise ValueError("MatmulConfig.weights_lhs needs interleave_lanes=True (the joined "
                       "tile of t is the left operand)")

  @classmethod
  def get_heuristics_config(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16, *,
                            wgmma: bool = False) -> "MatmulConfig":
    """A default for ``(M, out, in)`` and ``x``'s ``dtype``.

    ``wgmma``: the Mosaic GPU kernel can run this call (a Hopper GPU and
    ``out % 128 == 0``, ``in % 64 == 0``:
    :func:`jaxnoise.ops.ternary.mosaic_gpu_matmul.unsupported_reason`); it is
    then taken for the rows in :data:`WGMMA_DEFAULT_ROWS` (:meth:`wgmma_config`),
    16-bit ``x`` at 16-1024 rows and float32 ``x`` at 4-32, and the Triton
    paths below elsewhere. Session 33 (H100, jax 0.11.2, device time,
    4096^2 / 8192^2; ``benchmarks/RESULTS.md``), the kernel against this
    method's Triton choice:

    * bf16, M = 32: 14.1 / 40.4 us against 19.3 / 63.2 (dot tiles);
      M = 64: 18.6 / 52.8 (split 8) against 22.6 / 76.2; M = 128: 19.3 /
      54.1 against 30.5 / 121.2 (decode).
    * float32, M = 4: 16.5 / 42.7 against 26.9 / 122.6 (decode); M = 16:
      18.0 / 52.6 against 31.0 / 125.2; M = 32: 19.4 / 54.0 against 31.6 /
      125.0.
    * Not taken: bf16 M = 1-16 (14.5-16.8 / 39.3-42.3 us against the fma and
      dot tiles' 8.2-13.5 / 24.9-39.8), M = 256 (48.7 / 103.4 at split 8
      against decode's 34.6 / 125.9; fewer splits not measured) and 1024
      (106.5 / 315.4 against 61.0 / 254.9).

    The choices follow the compiled sweeps (H200, jax 0.11.2, 2026-12-01;
    ``benchmarks/results/2026-12-01-h200-s5/ternary*`` and, in device time,
    ``benchmarks/results/2026-12-01-h200-s6/matmul_run*``; bfloat16 ``x``):

    * ``M = 1``, 16-bit ``x``: CUDA-core ``"fma"`` tiles of 2-16 output units
      (one warp per two), whole rows of up to 4096 inputs per step, no split
      (:meth:`_gemv_config`); below ~2048 outputs, and for float32 ``x``,
      tiles of 16 output units with ``in`` split 8 ways (:meth:`_fma_config`).
    * ``M = 2-4`` (16-bit ``x``; 2-3 for float32): fma tiles of all rows, 8
      output units, 2048 inputs per step (:meth:`_fma_rows_config`).
    * ``5 <= M <= 64`` (16-bit ``x``): dot tiles with the code lanes joined
      into one tile of ``t`` (``interleave_lanes``) on the dot's left
      (``weights_lhs``), no software pipeline (:meth:`_dot_tiles`). Session 22
      (device time, 4096^2 / 8192^2, run 4): M=8 12.4 / 38.4 us, M=16 13.1 /
      39.4 (the per-lane dot tiles of sessions 6-21: 15.8 / 43.0 and 17.4 /
      47.6; a dense bf16 matmul 11.4 / 36.0 and 12.3 / 37.6); M=32 19.1 /
      63.7 (per-lane 25.2 / 84.9, decode 22.6 / 91.7); M=64 22.4 / 75.9
      against 25.9 / 93.1 for decode.
    * ``M > 64``, and float32 ``x`` from ``M = 4``: ``"decode"`` (Pallas
      decode to a dense temporary at copy bandwidth, then XLA's GEMM). Device
      time, session 6: 28.4 us at M=64 4096^2 vs 35.1 us for dot tiles; at
      M=256 / 1024, 30.6 / 57.5 us at 4096^2 and 99.4 / 221.6 us at 8192^2
      (0.52-0.86x of a dense bf16 matmul), 3.4-4.7x faster than the best of
      five GEMM tiles that decode in registers.
    * The decode writes the compute dtype. Below 128 GEMM rows int4 nibbles
      were faster (session 9: M=64 22.6 against 26.8 us at 4096^2, 65.2
      against 93.4 at 8192^2), but XLA's GEMM with an int4 operand gave wrong
      values on an H200 (2026-12-03), so that target is gone.
    * float32 ``x`` enters that GEMM as three bfloat16 pieces (``3 M`` GEMM
      rows; ``split_float32``). Session 11 (device time, 4096^2 / 8192^2),
      against session 10's configs: M=4 16.9 / 49.7 us (fma tiles of all
      rows 18.2 / 61.5), M=8 19.4 / 58.2 (37.6 / 119.7), M=16 23.9 us
      (66.1), M=32 28.8 / 76.8 (a float32 GEMM: 63.1 / 283.2), M=256
      58.4 / 197.5 (207.5 / 766.0), M=1024 178.7 us (713.9). The dot tiles
      that split ``x`` in registers took 100-116 / 262-368 us at M=4-16. At
      M=2 / 3 the fma tiles stay: 13.0 / 15.0 us at 4096^2 against 16.0 /
      16.9 for decode (8192^2: 45.6 / 51.9 against 46.4 / 49.8; run 3).

    Example:
      >>> config = MatmulConfig.get_heuristics_config((1, 4096, 4096), "bfloat16")
      >>> config.method, config.block_n, config.num_warps, config.split_k
      ('fma', 2, 1, 1)
      >>> config = MatmulConfig.get_heuristics_config((16, 4096, 4096), "bfloat16")
      >>> config.method, config.interleave_lanes, config.weights_lhs, config.split_k
      ('dot', True, True, 16)
      >>> config = MatmulConfig.get_heuristics_config((65, 4096, 4096), "bfloat16")
      >>> config.method, config.decode_to
      ('decode', 'compute')
    """
    m_rows, out_features, in_features = (int(d) for d in shape)
    itemsize = jnp.dtype(dtype).itemsize
    if wgmma and _prefers_wgmma(m_rows, itemsize):
      return cls.wgmma_config(shape, dtype)
    if m_rows == 1:
      if itemsize < 4 and out_features >= _GEMV_MIN_OUT:
        return cls._gemv_config(out_features, in_features)
      return cls._fma_config(m_rows, out_features, in_features)
    if m_rows <= (3 if itemsize >= 4 else 4):
      return cls._fma_rows_config(m_rows, out_features, in_features)
    if m_rows > 64 or itemsize >= 4:
      # decode + XLA GEMM: 2.0-3.6x faster than the per-lane dot tiles at M = 256 / 1024
      # (4096^2: 53-62 vs 116-125 us, 98 vs 252 us; 8192^2: 98 vs 320 us, 244 vs 885 us),
      # and than the joined tiles of session 22 (runs 2-3: 49-66 vs 30 us at M=256
      # 4096^2). float32 x enters XLA's GEMM as three bfloat16 pieces (split_float32),
      # exact products as a float32 GEMM's.
      return cls(method="decode")
    return cls._dot_tiles(shape, dtype)

  @classmethod
  def wgmma_config(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16) -> "MatmulConfig":
    """Tiles of the ``"wgmma"`` kernel for ``(M, out, in)``.

    * ``block_m``: ``M`` (float32 ``x``: ``3 M``, its bfloat16 pieces) rounded
      up to a power of 2 from 8 (the narrowest ``wgmma``), at most 128.
    * ``split_k``: the fewest slabs of ``in`` (a power of 2) that give at least
      128 programs (about one a multiprocessor), each slab keeping at least 8
      steps of 64 inputs. Session 33 (H100, device time, bf16): fewer, longer
      programs were faster at every shape measured. 4096^2 M=32: split 4
      (128 programs) 14.1 us, 8 15.5, 16 20.2; M=128: 19.3 / 24.8 / 40.0;
      8192^2 M=32: 40.4 / 45.1 / 52.8, M=128: 54.1 / 68.5 / 95.7 (split 2,
      which this rule picks at 8192^2, was not measured); float32 M=32:
      19.4 / 24.7 / 39.0 and 54.0 / 69.5 / 97.6.
    * ``num_stages``: 8 steps in buffers for batch tiles up to 16 (a step is
      mostly the codes' 6 KiB), else 4 (8 against 4 at M=32: 16.1 against
      15.5 us at 4096^2, 44.3 against 45.1 at 8192^2).
    * ``substeps``: 2 (two steps a buffer, half the buffers) for batch tiles
      up to 16 where a slab's steps are even, else 1
      (:data:`_WGMMA_SUBSTEPS_MAX_BLOCK_M` has the figures).

    Example:
      >>> config = MatmulConfig.wgmma_config((4, 4096, 4096))
      >>> config.block_m, config.split_k, config.num_stages, config.substeps
      (8, 4, 4, 2)
      >>> config = MatmulConfig.wgmma_config((256, 8192, 8192))
      >>> config.block_m, config.split_k, config.num_stages, config.substeps
      (256, 2, 4, 1)
    """
    m_rows, out_features, in_features = (int(d) for d in shape)
    rows = 3 * m_rows if jnp.dtype(dtype).itemsize >= 4 else m_rows
    block_m = min(_WGMMA_HEURISTIC_MAX_BLOCK_M, max(8, next_power_of_2(rows)))
    tiles = max(1, out_features // WGMMA_BLOCK_N) * -(-rows // block_m)
    steps = max(1, in_features // WGMMA_STEP)
    split = 1
    while (tiles * split < _WGMMA_PROGRAMS and steps % (2 * split) == 0
           and steps // (2 * split) >= _WGMMA_MIN_STEPS):
      split *= 2
    slab_steps = steps // split
    substeps = 2 if block_m <= _WGMMA_SUBSTEPS_MAX_BLOCK_M and slab_steps % 2 == 0 else 1
    stages = max(1, min((8 if block_m <= 16 else 4) // substeps, slab_steps // substeps))
    return cls(block_m=block_m, block_n=WGMMA_BLOCK_N, block_groups=WGMMA_STEP // 4,
               num_warps=4, num_stages=stages, split_k=split, method="wgmma",
               substeps=substeps)

  @classmethod
  def wgmma_candidates(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16
                       ) -> list["MatmulConfig"]:
    """:meth:`wgmma_config`'s tiles, then their split along ``in`` doubled and halved (where
    it divides the steps), the other pipeline depth (4 or 8 steps in buffers) and the other
    number of steps a buffer (at the same steps in buffers).

    Example:
      >>> [(c.split_k, c.num_stages, c.substeps)
      ...  for c in MatmulConfig.wgmma_candidates((16, 4096, 4096))]
      [(4, 4, 2), (8, 4, 2), (2, 4, 2), (4, 2, 2), (4, 8, 1)]
    """
    tiles = cls.wgmma_config(shape, dtype)
    steps = int(shape[2]) // WGMMA_STEP
    out = [tiles]
    for split in (2 * tiles.split_k, tiles.split_k // 2):
      if split and steps % split == 0 and steps // split % tiles.substeps == 0:
        out.append(dataclasses.replace(tiles, split_k=split))
    other_depth = 4 if tiles.num_stages * tiles.substeps > 4 else 8  # steps in buffers
    out.append(dataclasses.replace(tiles, num_stages=max(1, other_depth // tiles.substeps)))
    other = 3 - tiles.substeps
    if steps // tiles.split_k % other == 0:
      out.append(tiles.with_substeps(other))
    return out

  def with_substeps(self, substeps: int) -> "MatmulConfig":
    """These ``"wgmma"`` tiles with ``substeps`` steps a buffer and the same steps in buffers
    (the same shared memory).

    Example:
      >>> config = MatmulConfig.wgmma_config((16, 4096, 4096))
      >>> (config.num_stages, config.substeps)
      (4, 2)
      >>> other = config.with_substeps(1)
      >>> (other.num_stages, other.substeps)
      (8, 1)
    """
    buffered = self.num_stages * self.substeps
    return dataclasses.replace(self, substeps=substeps, num_stages=max(1, buffered // substeps))

  @classmethod
  def _gemv_config(cls, out_features: int, in_features: int) -> "MatmulConfig":
    """One row of 16-bit ``x``: small programs over whole rows, no split along ``in``.

    ``out / 2048`` output units per program (2 to 16, a power of 2) and one
    warp per two of them, so ~2048 programs of 1-8 warps; up to 4096 inputs
    per step. Nothing follows the kernel (a split needs XLA's sum of the
    partial tiles, 1.4-1.6 us). Session 19 run 3 (device time; the split
    tiles of :meth:`_fma_config` beside it): 4096^2 7.36 us with 2 units and
    one warp (8.75 split; a dense bf16 matmul 13.03: 1.77x), 8192^2 22.99 us
    with 4 units and two warps (23.69 split; dense 37.91: 1.65x).
    """
    per_program = out_features // _WHOLE_ROW_PROGRAMS
    block_n = 1 << max(1, min(4, per_program.bit_length() - 1))  # a power of 2, 2 to 16
    block_groups = min(1024, max(4, next_power_of_2(max(1, -(-in_features // 4)))))
    return cls(block_m=1, block_n=block_n, block_groups=block_groups,
               num_warps=max(1, block_n // 2), num_stages=3, split_k=1, method="fma")

  @classmethod
  def _fma_config(cls, m_rows: int, out_features: int, in_features: int) -> "MatmulConfig":
    """CUDA-core tiles: 16 outputs x 512 inputs per step, ``in`` split 8 ways.

    One row of float32 ``x``, or of 16-bit ``x`` below 2048 outputs (else
    :meth:`_gemv_config`); XLA sums the partial tiles after the kernel.

    Session 6 run 5 (device time, ``x`` lanes loaded strided in the kernel):
    10.8 us at 4096^2 and 30.2 us at 8192^2 with the sum of the partial tiles,
    within 5% of the best of 5 configs at both (session-5 tiles: 14.1 and
    41.1 us; a dense bf16 matmul: 13.0 and 37.6 us). Session 7 run 8, ``x`` in
    16-byte vectors (``x_vector_loads``): 10.2 and 28.8 us against 10.7 and
    30.2 us strided in the same run (dense bf16: 13.9 and 37.8 us), within 3%
    of the best of 8 configs.
    """
    del out_features  # The same config was best at out = 4096 and 8192.
    block_groups = 128
    steps = max(1, -(-max(1, in_features // 4) // block_groups))
    return cls(block_m=next_power_of_2(m_rows), block_n=16, block_groups=block_groups,
               num_warps=4, num_stages=3, split_k=min(steps, 8), method="fma")

  @classmethod
  def _fma_rows_config(cls, m_rows: int, out_features: int, in_features: int
                       ) -> "MatmulConfig":
    """CUDA-core tiles of all ``M`` rows: 8 outputs x 2048 inputs per step.

    The rows share each weight's decode (``t`` once, a multiply-add per
    row). ``in`` is split only while ``out / 8`` gives fewer than ~512
    programs. Session 10 (device time; run 1 the sweep, run 2 the merged
    code), at 4096^2 / 8192^2 against the 16-row dot tiles and a dense bf16
    matmul:

    * M = 2: 11.9 / 37.7 us, the best of 8 fma configs, against 17.1 / 43.5
      and 11.2 / 35.6 us;
    * M = 3 (tiles of 4 rows): 13.6 / 43.3 us against 16.8 / 43.7 and
      11.3 / 35.6 us;
    * M = 4: 15.9-16.0 / 49.4-49.5 us against 17.3 / 43.7-44.0 us, so the dot
      tiles stayed from 4 rows on for 16-bit ``x``.

    Session 18 (run 1), with ``t`` from two clamped adds per code and one
    ``fma`` per product: M = 2 9.7 / 28.3 us, M = 3 10.8 / 33.8, M = 4 12.6 /
    36.3 (the dot tiles 14.9 / 40.9; dense bf16 11.0-11.5 / 36.2-36.3), so 16-bit
    ``x`` takes these tiles up to 4 rows.

    float32 ``x`` (run 4): the dot tiles (exact float32 products, no tensor
    cores) took 161-163 / 635-636 us at every M from 2 to 16; these tiles take
    12.9 / 44.5 us at M = 2, 18.0 / 61.3 at 4, 37.6 / 120.2 at 8 and 66.5 /
    201.1 at 16 (a dense float32 matmul: 19.7-21.8 / 65.7-68.8 us).
    """
    block_n, block_groups = 8, 512
    return cls(block_m=next_power_of_2(m_rows), block_n=block_n, block_groups=block_groups,
               num_warps=4, num_stages=3, method="fma",
               split_k=_gemv_split_k(out_features, in_features, block_n, block_groups))

  @classmethod
  def _dot_tiles(cls, shape: Sequence[int], dtype: Any) -> "MatmulConfig":
    """Tensor-core tiles of the forward's dot method for ``(M, out, in)``.

    16-bit ``x`` up to 64 rows: ``t`` joined into one tile per step on the
    dot's left (``interleave_lanes``, ``weights_lhs``), one pipeline stage.
    Up to 16 rows, one 16-row tile of 64 output units, 256 inputs per step,
    ``in`` split for ~:data:`_DOT_PROGRAMS` programs; 17-64 rows, tiles of
    all rows and 128 output units, 128 inputs per step, split while the tiles
    alone give fewer programs than the H200 has SMs. float32 ``x`` up to 16
    rows: 32 outputs x 64 inputs per step, ``in`` split for ~512 programs.
    Larger ``M`` uses GEMM tiles (64-128 square, 64-128 inputs per step),
    split along ``in`` while the tiles alone give fewer programs than a large
    GPU has SMs.
    """
    m_rows, out_features, in_features = (int(d) for d in shape)
    itemsize = jnp.dtype(dtype).itemsize
    steps_of = lambda groups: max(1, -(-max(1, in_features // 4) // groups))
    if itemsize <= 2 and m_rows <= 64:
      # 16-bit x, decode-sized M: t joined on the left (warpgroup MMA from registers), no
      # software pipeline (session 22 runs 2-3: with 2-3 stages every config of several
      # steps per program took 2-3x longer).
      if m_rows <= 16:  # 64 outputs x 256 inputs per step, ~1024 programs
        return cls(block_m=16, block_n=64, block_groups=64, num_warps=4, num_stages=1,
                   split_k=_gemv_split_k(out_features, in_features, 64, 64, _DOT_PROGRAMS),
                   interleave_lanes=True, weights_lhs=True)
      # All rows in one tile: split while the tiles give fewer programs than the H200's SMs.
      return cls(block_m=next_power_of_2(m_rows), block_n=128, block_groups=32, num_warps=8,
                 num_stages=1, split_k=_gemv_split_k(out_features, in_features, 128, 32, 132),
                 interleave_lanes=True, weights_lhs=True)
    if m_rows <= 16:
      # float32 x: 32 outputs x 64 inputs per step (16 per code lane, the least a dot
      # contracts), as exact FMA tiles without split_float32.
      return cls(block_m=16, block_n=32, block_groups=16, num_warps=4, num_stages=3,
                 split_k=_gemv_split_k(out_features, in_features, 32, 16))
    if itemsize >= 4:
      return cls()
    block = 128 if (m_rows >= 1024 and out_features >= 1024 and itemsize <= 2) else 64
    tiles = -(-m_rows // block) * -(-out_features // block)
    groups = 32 if block == 128 else 16
    split = min(steps_of(groups), next_power_of_2(max(1, 132 // tiles))) if tiles < 132 else 1
    return cls(block_m=block, block_n=block, block_groups=groups,
               num_warps=8 if block == 128 else 4, num_stages=3, split_k=split)

  @classmethod
  def get_input_grad_heuristics_config(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16
                                       ) -> "MatmulConfig":
    """The input gradient's config for ``(M, in, out)`` and ``grad_y``'s ``dtype``.

    * One row of 16-bit ``grad_y``: dot tiles with ``out`` split
      (:meth:`_input_grad_dot_tiles`); XLA's one-row GEMM after the decode
      was the slow one.
    * From 2 rows, and float32 at any ``M``: ``"decode"`` and XLA's GEMM
      (float32 ``grad_y * scale`` as three bfloat16 pieces). The figures
      below marked int4 had int4 nibbles as the GEMM's operand below 128
      rows, a target removed on 2026-12-03 (XLA's int4 GEMM gave wrong values;
      with the bfloat16 temporary session 11 measured M = 1-4 at 22.6-23.2 us
      at 4096^2, against 18.6-18.8 with int4).

    Session 11 (H200, device time, ``benchmarks/results/2026-12-02-h200-s11``
    run 2; session 10 ran one program per 256 inputs over all of ``out``, and
    exact float32 dots), 4096^2 / 8192^2, bfloat16:

    * M = 1: 19.8 / 68.4 us (dot tiles, 256 inputs, ``out`` split 16 / 8)
      against 272 / 564 us; decode (int4) 35.7 / 78.9 us.
    * M = 2-16: decode (int4) 18.9-19.5 / 58.3-59.9 us (M = 4-16: 216-230 /
      431-463 us before); the split dot tiles 20.0-23.9 / 68.2-71.3 us
      (run 3 for M = 2, 3).
    * M = 64 (int4), 256 and 1024: 27.2 / 71.8, 33.0 / 103.0 and 63.3 /
      228.3 us against 143.8 / 288.4, 197.3 / 791.8 and 323.7 / 1262 us
      (0.50-0.78x of a dense bfloat16 ``grad_y @ W``).

    float32, decode against session 10's exact float32 dot tiles: M = 1-16
    18.7-25.3 / 58.3-70.4 us (int4; run 3) against 157-160 / 314-322 us;
    M = 64 33.7 / 105.4 us against 3552 / 8579 us; M = 256 58.1 / 192.9
    against 7314 / 24167; M = 1024 178.9 / 616.8 against 24076 / 96083.

    Example:
      >>> config = MatmulConfig.get_input_grad_heuristics_config((1, 4096, 4096))
      >>> config.method, config.block_m, config.block_groups, config.split_k
      ('dot', 16, 64, 16)
      >>> config = MatmulConfig.get_input_grad_heuristics_config((256, 4096, 4096))
      >>> config.method, config.decode_to
      ('decode', 'compute')
    """
    m_rows = int(shape[0])
    if m_rows >= 2 or jnp.dtype(dtype).itemsize >= 4:
      return cls(method="decode")
    return cls._input_grad_dot_tiles(shape)

  @classmethod
  def _input_grad_dot_tiles(cls, shape: Sequence[int]) -> "MatmulConfig":
    """Input-gradient dot tiles for ``(M, in, out)``: 16-64 rows x 256 inputs, ``out`` split.

    64 outputs per step; ``out`` split so that there are ~256 programs (one
    program per 256 inputs over all of ``out`` left 16 programs at
    ``in = 4096``). Session 11 run 2 (bfloat16, M = 1-16): 19.8-23.9 us at
    4096^2 and 68.4-71.3 us at 8192^2; 128 inputs per tile with ~512
    programs took 21.3-24.1 / 74.9-78.1 us.
    """
    m_rows, in_features, out_features = (int(d) for d in shape)
    block_m, block_n, block_groups = min(64, max(16, next_power_of_2(m_rows))), 64, 64
    tiles = -(-m_rows // block_m) * -(-max(1, in_features // 4) // block_groups)
    steps = -(-out_features // block_n)
    split = min(steps, next_power_of_2(max(1, _INPUT_GRAD_PROGRAMS // tiles)))
    return cls(block_m=block_m, block_n=block_n, block_groups=block_groups, num_warps=4,
               num_stages=3, split_k=split)

  @classmethod
  def input_grad_candidates(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16
                            ) -> list["MatmulConfig"]:
    """The input gradient's heuristic for ``(M, in, out)``, then decode and split dot tiles."""
    replace = dataclasses.replace
    dot = cls._input_grad_dot_tiles(shape)
    out = [cls.get_input_grad_heuristics_config(shape, dtype)]
    out += [cls(method="decode"), dot, replace(dot, split_k=2 * dot.split_k),
            replace(dot, split_k=max(1, dot.split_k // 2)),
            replace(dot, block_groups=32, split_k=2 * dot.split_k)]
    return list(dict.fromkeys(out))

  @classmethod
  def candidates(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16, *,
                 wgmma: bool = False) -> list["MatmulConfig"]:
    """The heuristic and a few neighbours (autotuning and the benchmark sweep).

    ``wgmma`` (the Mosaic GPU kernel can run this call): its tiles, their split
    along ``in`` doubled and halved and the other pipeline depth come first.
    """
    m_rows, out_features, in_features = (int(d) for d in shape)
    base = cls.get_heuristics_config(shape, dtype)
    out = [base]
    replace = dataclasses.replace
    if wgmma:
      out = ([cls.get_heuristics_config(shape, dtype, wgmma=True)]
             + cls.wgmma_candidates(shape, dtype) + out)
    if m_rows <= 16:
      fma = cls._fma_config(m_rows, out_features, in_features)
      dot = base if base.method == "dot" else replace(cls._dot_tiles(shape, dtype),
                                                      word_loads=False)
      if m_rows == 1:
        gemv = cls._gemv_config(out_features, in_features)
        out += [fma, gemv, replace(gemv, block_n=gemv.block_n * 2, num_warps=gemv.num_warps * 2),
                replace(gemv, block_groups=max(4, gemv.block_groups // 2))]
        fma = replace(fma, block_groups=64)
        out += [fma, replace(fma, split_k=fma.split_k * 2),
                replace(fma, split_k=max(1, fma.split_k // 2))]
      elif m_rows <= 4 or base.method == "fma":  # rows sharing each weight's decode
        rows = cls._fma_rows_config(m_rows, out_features, in_features)
        out += [rows, replace(rows, block_n=4, num_warps=2), replace(rows, block_groups=256),
                replace(rows, split_k=rows.split_k * 2)]
      out += [dot, replace(dot, block_groups=32, split_k=dot.split_k * 2),
              replace(dot, split_k=max(1, dot.split_k // 2)),
              replace(dot, split_k=dot.split_k * 2), replace(dot, word_loads=True)]
    else:
      dot = cls._dot_tiles(shape, dtype)
      out += [dot, replace(dot, block_groups=dot.block_groups * 2),
              replace(dot, num_stages=1 if dot.num_stages > 1 else 3), cls(method="decode")]
      if m_rows >= 256:
        out += [cls(block_m=128, block_n=256, block_groups=16, num_warps=8, num_stages=3),
                cls(block_m=128, block_n=128, block_groups=16, num_warps=8, num_stages=4)]
    if dot.interleave_lanes:  # the per-lane dots of the same tiles, pipelined
      out.append(replace(dot, interleave_lanes=False, weights_lhs=False, num_stages=3))
      if m_rows > 16:  # session 22 run 6, M=64: 21.6 / 69.7 against 22.4 / 75.6 us
        out.append(replace(dot, block_groups=2 * dot.block_groups, register_prefetch=True))
    unique = []
    for config in out:
      if config not in unique:
        unique.append(config)
    return unique


# ----------------------------------------------------------------------------
# Autotuning cache keys (see jaxnoise.ops.autotune): what selects a tiling.


def matmul_key(implementation: str, m_rows: int, out_features: int, in_features: int,
               x_dtype: Any, out_dtype: Any) -> tuple[str, tuple]:
  """``(op, key)`` of a packed matmul of ``(M, in)`` inputs."""
  op = "ternary_matmul"
  return op, (op, implementation, (int(m_rows), int(out_features), int(in_features)),
              str(jnp.dtype(x_dtype)), str(jnp.dtype(out_dtype)))


def matmul_input_grad_key(implementation: str, m_rows: int, in_features: int,
                          out_features: int, grad_dtype: Any, out_dtype: Any
                          ) -> tuple[str, tuple]:
  """``(op, key)`` of the packed matmul's input gradient from an ``(M, out)`` ``grad_y``."""
  op = "ternary_matmul_input_grad"
  return op, (op, implementation, (int(m_rows), int(in_features), int(out_features)),
              str(jnp.dtype(grad_dtype)), str(jnp.dtype(out_dtype)))
