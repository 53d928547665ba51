"""Tiling of the counter updates: :class:`CounterUpdateConfig` (dense gradient) and
:class:`FromIOConfig` (``grad_out^T x`` formed in the kernels), and their autotuning keys."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

from jaxnoise.ops.ternary.config._common import (
    _check_pow2,
    _check_warps_stages,
    _warps_for,
    next_power_of_2,
)

__all__ = ["CounterUpdateConfig", "FromIOConfig", "counter_update_key", "from_io_key"]


@dataclasses.dataclass(frozen=True)
class CounterUpdateConfig:
  """Tiling of the fused counter update on a dense gradient.

  A program owns ``block_rows`` whole rows. A row of up to
  ``MAX_RESIDENT_GROUPS`` groups is held in registers as static power-of-2
  chunks (:meth:`row_chunks`: pieces of at most ``block_groups`` groups
  covering the row rounded up to ``tail_groups``; only the last is masked),
  so the gradient and the codes are read once. Longer rows take two passes
  over chunks of ``block_groups`` (statistics, then update).

  Attributes:
    block_rows: rows per program.
    block_groups: largest chunk, in groups of four codes (power of 2).
    tail_groups: granule of the row's rounding (power of 2 <= block_groups);
      ``tail_groups == block_groups`` rounds the row up to whole chunks.
    num_warps: Triton warps per program.
    num_stages: software-pipelining depth of the two-pass loops.
    word_loads: read the packed codes as uint32 words (three per 16 codes)
      when ``in % 16 == 0`` and every chunk is a multiple of 4 groups; else
      three bytes per 4 codes.
    vector_loads: read the gradient in 16-byte vectors split in registers;
      else one strided load per column lane.
  """

  block_rows: int = 1
  block_groups: int = 1024
  tail_groups: int = 64
  num_warps: int = 8
  num_stages: int = 1
  word_loads: bool = True
  vector_loads: bool = True

  MAX_RESIDENT_GROUPS = 4096  # 16384 inputs per row in registers (with 16 warps: 32 per thread).

  def __post_init__(self):
    _check_pow2(self, ("block_rows", "block_groups", "tail_groups"))
    _check_warps_stages(self)
    if self.tail_groups > self.block_groups:
      raise ValueError(f"CounterUpdateConfig.tail_groups={self.tail_groups} must be <= "
                       f"block_groups={self.block_groups}")
    for name in ("word_loads", "vector_loads"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"CounterUpdateConfig.{name} must be a bool, got {getattr(self, name)!r}")

  def uses_words(self, in_features: int) -> bool:
    """Whether the kernel reads ``in_features``-long rows as words."""
    return (self.word_loads and in_features % 16 == 0 and self.tail_groups >= 4)

  def row_chunks(self, n_groups: int) -> tuple[tuple[int, int], ...] | None:
    """``(first group, groups)`` of the static chunks of a row, or None for the two-pass loop.

    Example:
      >>> CounterUpdateConfig(block_groups=512, tail_groups=64).row_chunks(576)
      ((0, 512), (512, 64))
      >>> CounterUpdateConfig(block_groups=1024, tail_groups=64).row_chunks(999)
      ((0, 1024),)
    """
    if n_groups > self.MAX_RESIDENT_GROUPS:
      return None
    total = -(-n_groups // self.tail_groups) * self.tail_groups
    chunks, start = [], 0
    while start < total:
      size = min(self.block_groups, 1 << ((total - start).bit_length() - 1))
      chunks.append((start, size))
      start += size
    return tuple(chunks)

  @classmethod
  def get_heuristics_config(cls, shape: Sequence[int], dtype: Any = jnp.float32
                            ) -> "CounterUpdateConfig":
    """A default for an ``(out, in)`` gradient of ``dtype``.

    The update is memory-bound at ~40 instructions per weight, so each thread
    holds ~4 groups (16 weights: few registers, many resident warps) up to 8
    warps, a row is one program up to 16384 inputs (two passes beyond), and
    ragged rows are cut into a power-of-2 chunk and a tail (``in = 2304``:
    2048 + 256 inputs) instead of being masked up to the next power of 2.
    Warps follow the compiled sweep (H200, jax 0.11.2, 2026-12-01,
    ``benchmarks/results/2026-12-01-h200-s5/ternary_run2``); 16-bit gradients
    take 4 where float32 ones take 8 (2026-12-04, session 21 run 6: 5-8% less
    time at 8192^2, 4096^2, 11008x4096 and 1000x3996 in bfloat16; float32 was
    mixed, -1.6% to +2.6%).

    Example:
      >>> config = CounterUpdateConfig.get_heuristics_config((4096, 4096))
      >>> config.block_rows, config.block_groups, config.num_warps
      (1, 1024, 8)
      >>> CounterUpdateConfig.get_heuristics_config((4096, 4096), "bfloat16").num_warps
      4
    """
    out_features, in_features = (int(d) for d in shape)
    groups = max(1, in_features // 4)
    if groups > cls.MAX_RESIDENT_GROUPS:
      return cls(block_rows=1, block_groups=2048, tail_groups=2048, num_warps=16, num_stages=2)
    block_groups = next_power_of_2(groups)
    tail_groups = min(block_groups, max(4, block_groups // 16))
    block_rows = max(1, min(next_power_of_2(out_features), 1024 // block_groups))
    config = cls(block_rows=block_rows, block_groups=block_groups, tail_groups=tail_groups)
    chunks = config.row_chunks(groups)
    # At most 8 warps: 8192x8192 float32 162.9 us (62.1% of copy bandwidth) with 8 against
    # 231.5 us (43.7%) with 16; bfloat16 154.9 vs 159.9 us (41.5% vs 40.2%).
    num_warps = min(8, _warps_for(block_rows * chunks[0][1], 4))
    if len(chunks) > 1:
      # A chunk and a tail: fewer threads replicate less of the tail. 1536x2304 float32:
      # 2 warps 25.3 us (21.1%) against 27.1 us (19.7%) with 4.
      num_warps = max(1, num_warps // 2)
    config = dataclasses.replace(config, num_warps=num_warps, num_stages=1)
    # Word units (16 codes) are cheaper per weight, but a chunk smaller than the
    # program's threads is replicated across them: pick the layout with the lower
    # estimated cost (SASS instructions per weight, sm_90, measured offline).
    threads = 32 * num_warps
    cost = {}
    for words, per_unit, per_weight in ((True, 4, 52.0), (False, 1, 60.0)):
      if words and not config.uses_words(in_features):
        continue
      slots = sum(-(-block_rows * max(1, size // per_unit) // threads) for _, size in chunks)
      used = block_rows * groups / per_unit
      cost[words] = per_weight * slots * threads / used
    config = dataclasses.replace(config, word_loads=min(cost, key=cost.get))
    if jnp.dtype(dtype).itemsize == 2 and config.num_warps == 8:
      # The layout stays the one chosen for 8 warps: the configs measured.
      config = dataclasses.replace(config, num_warps=4)
    return config

  @classmethod
  def candidates(cls, shape: Sequence[int], dtype: Any = jnp.float32
                 ) -> list["CounterUpdateConfig"]:
    """The heuristic and its neighbours (autotuning and the benchmark sweep).

    Half and twice the warps, the row rounded to whole chunks (one masked
    chunk), the other code layout (words / bytes), strided gradient loads, two
    rows per program.
    """
    base = cls.get_heuristics_config(shape, dtype)
    out = [base,
           dataclasses.replace(base, num_warps=max(1, base.num_warps // 2)),
           dataclasses.replace(base, num_warps=min(16, base.num_warps * 2)),
           dataclasses.replace(base, tail_groups=base.block_groups),
           dataclasses.replace(base, word_loads=not base.word_loads),
           dataclasses.replace(base, vector_loads=False)]
    if base.block_rows == 1 and int(shape[0]) > 1:
      out.append(dataclasses.replace(base, block_rows=2, num_warps=min(16, base.num_warps * 2)))
    unique = []
    for config in out:
      if config not in unique:
        unique.append(config)
    return unique


@dataclasses.dataclass(frozen=True)
class FromIOConfig:
  """Tiling of :func:`counter_update_from_io` (``grad_out^T x`` formed in the kernel).

  Attributes:
    block_rows: output rows per tile (the GEMM's M side; >= 16 for tensor cores).
    block_groups: groups per tile (the GEMM's N side is ``4 * block_groups``).
    block_m: rows of ``x`` / ``grad_out`` per step of the reduction (the
      GEMM's K side; >= 16).
    num_warps: Triton warps per program.
    num_stages: software-pipelining depth of the reduction loop.
    allow_tf32: let float32 inputs use TF32 tensor cores (faster, ~1e-3
      relative error in the gradient, so more codes round differently from
      the float32 reference); False uses exact float32 products.
    word_loads: read the codes as uint32 words (three per 16 codes) when
      ``in % 16 == 0`` and ``block_groups >= 4`` (``>= 64`` for ``"dot"``);
      else three bytes per 4.
    xla_gemm_rows: None (the default: the kernels form the gradient tile
      by tile, and no dense gradient exists), or a row count: XLA's GEMM
      forms ``xla_gemm_rows`` output rows of the gradient at a time (float32)
      and the dense-gradient kernel of
      :func:`jaxnoise.ops.ternary.counter_update` updates those rows of the
      state in place, one block after another in a ``fori_loop``. The GEMM
      runs once and at XLA's speed, where the kernels form every tile twice
      (statistics, then update) for rows longer than one tile; the temporary
      memory is one block's gradient (``xla_gemm_rows * in * 4`` bytes), its
      columns of ``grad_out`` and XLA's GEMM workspace, not the whole
      ``(out, in)`` gradient. On an H200 (4096x4096 bf16, session 21 in
      ``benchmarks/RESULTS.md``) 1024 rows took 1.19x of XLA's GEMM plus the
      update at M = 4096 with 56 MiB of temporaries (the kernels: 1.86x with
      0.5 MiB; GEMM plus update: 96 MiB); the saving grows with the layer's
      height. The tile fields above do not apply.
  """

  block_rows: int = 32
  block_groups: int = 32
  block_m: int = 32
  num_warps: int = 4
  num_stages: int = 3
  allow_tf32: bool = False
  word_loads: bool = True
  xla_gemm_rows: int | None = None

  def __post_init__(self):
    _check_pow2(self, ("block_rows", "block_groups", "block_m"))
    _check_warps_stages(self)
    for name, least in (("block_rows", 16), ("block_groups", 4), ("block_m", 16)):
      if getattr(self, name) < least:
        raise ValueError(f"FromIOConfig.{name} must be >= {least} (Triton dot tiles of at "
                         f"least 16), got {getattr(self, name)}")
    for name in ("allow_tf32", "word_loads"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"FromIOConfig.{name} must be a bool, got {getattr(self, name)!r}")
    rows = self.xla_gemm_rows
    if rows is not None and (not isinstance(rows, int) or isinstance(rows, bool) or rows <= 0):
      raise ValueError(f"FromIOConfig.xla_gemm_rows must be None or a positive int, "
                       f"got {rows!r}")

  def fused(self, in_features: int) -> bool:
    """True when one tile spans whole rows: statistics and update in one kernel."""
    return self.block_groups >= in_features // 4

  @classmethod
  def get_heuristics_config(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16
                            ) -> "FromIOConfig":
    """A default for ``(M, out, in)`` and the inputs' ``dtype``.

    Rows up to ``in = 512`` fit one tile (a single fused kernel). Longer
    rows use ``64 x 128`` tiles in two kernels (statistics, then a
    recomputing update), each a GEMM over ``M`` in steps of ``block_m`` with
    ``out / 64 * in / 128`` programs; ``128 x 256`` tiles with 8 warps from
    ``M = 1024`` (16-bit inputs).

    Example:
      >>> config = FromIOConfig.get_heuristics_config((4096, 4096, 4096), "bfloat16")
      >>> config.fused(4096), config.block_rows, 4 * config.block_groups
      (False, 128, 256)
    """
    m_rows, out_features, in_features = (int(d) for d in shape)
    groups = max(1, in_features // 4)
    itemsize = jnp.dtype(dtype).itemsize
    block_m = 32 if itemsize >= 4 else 64
    block_m = max(16, min(block_m, next_power_of_2(m_rows)))
    if next_power_of_2(groups) <= 128:
      block_groups = max(4, next_power_of_2(groups))
      return cls(block_rows=16, block_groups=block_groups, block_m=block_m,
                 num_warps=_warps_for(4 * 16 * block_groups, 32), num_stages=3)
    if m_rows >= 1024 and itemsize <= 2:
      # 128 x 256 tiles, 8 warps at large M (fewer re-reads of x and grad_out), 4096^2
      # bfloat16 on an H200: at M=4096 493 us against 666 us (wall clock, session 5); at
      # M=1024 the tuner's pick, 146.5 against 172.1 us of device time (session 7).
      return cls(block_rows=max(16, min(128, next_power_of_2(out_features))), block_groups=64,
                 block_m=block_m, num_warps=8, num_stages=3)
    # 64 x 128 tiles, 4 warps: 128 registers and no spills in either kernel (sm_90,
    # offline); 128 x 128 spills a little in the update kernel (a sweep candidate).
    block_rows = max(16, min(64, next_power_of_2(out_features)))
    return cls(block_rows=block_rows, block_groups=32, block_m=block_m, num_warps=4,
               num_stages=3)

  @classmethod
  def candidates(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16) -> list["FromIOConfig"]:
    """The heuristic and a few larger tiles (autotuning and the benchmark sweep)."""
    base = cls.get_heuristics_config(shape, dtype)
    out = [base]
    if not base.fused(int(shape[2])):
      out += [dataclasses.replace(base, block_rows=64, block_groups=32, num_warps=4),
              dataclasses.replace(base, block_rows=128, block_groups=64, num_warps=8),
              dataclasses.replace(base, block_rows=128, block_groups=32, num_warps=8),
              dataclasses.replace(base, block_rows=64, block_groups=64, block_m=32,
                                  num_warps=8),
              dataclasses.replace(base, block_m=32, num_stages=4),
              dataclasses.replace(base, word_loads=False)]
    unique = []
    for config in out:
      if config not in unique:
        unique.append(config)
    return unique


# ----------------------------------------------------------------------------
# Autotuning cache keys (see jaxnoise.ops.autotune): what selects a tiling.


def counter_update_key(implementation: str, shape: Sequence[int], grad_dtype: Any
                       ) -> tuple[str, tuple]:
  """``(op, key)`` of a counter update on an ``(out, in)`` gradient of ``grad_dtype``."""
  op = "ternary_counter_update"
  return op, (op, implementation, tuple(int(d) for d in shape), str(jnp.dtype(grad_dtype)))


def from_io_key(implementation: str, m_rows: int, out_features: int, in_features: int,
                dtype: Any) -> tuple[str, tuple]:
  """``(op, key)`` of an update from ``(M, in)`` inputs and ``(M, out)`` output gradients."""
  op = "ternary_counter_update_from_io"
  return op, (op, implementation, (int(m_rows), int(out_features), int(in_features)),
              str(jnp.dtype(dtype)))
