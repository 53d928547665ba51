"""Frozen kernel configs of the ternary ops and their heuristic defaults.

Every Triton tensor must have power-of-2 sizes, so all block sizes here are
powers of two; ragged edges are masked in the kernels. A config is hashable
(it is a static argument of the jitted ops) and every field is used by its
kernel: nothing is accepted and ignored.

Tiling, in "groups" of four codes (one group = 3 packed bytes = 4 inputs):

* :class:`ElementwiseConfig` (pack, unpack, decode, init) and
  :class:`CounterUpdateConfig`: one program per ``block_rows`` rows, walking
  the row in chunks of ``block_groups`` groups. When one chunk covers the row
  (the default up to ``in = 16384``) the row stays in registers and the
  update reads the gradient once; longer rows take two passes (statistics,
  then update), the second one mostly from L2.
* :class:`FromIOConfig`: GEMM-like ``block_rows x (4 * block_groups)`` tiles
  of ``grad_out^T x`` accumulated over ``block_m`` rows of ``M`` at a time.
* :class:`MatmulConfig`: ``block_m x block_n`` output tiles of ``x @ W^T``
  walking ``in`` in chunks of ``block_groups`` groups.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp

__all__ = [
    "CounterUpdateConfig",
    "ElementwiseConfig",
    "FromIOConfig",
    "MatmulConfig",
    "check_config",
]

# Largest register-resident row (groups) of the single-pass update.
_MAX_RESIDENT_GROUPS = 4096


def next_power_of_2(n: int) -> int:
  return 1 << max(0, int(n) - 1).bit_length()


def _check_pow2(config: Any, names: Sequence[str]) -> None:
  for name in names:
    value = getattr(config, name)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value & (value - 1):
      raise ValueError(
          f"{type(config).__name__}.{name} must be a positive power of 2 (Triton tensors "
          f"need power-of-2 sizes), got {value!r}"
      )


def _check_warps_stages(config: Any) -> None:
  if config.num_warps not in (1, 2, 4, 8, 16, 32):
    raise ValueError(f"{type(config).__name__}.num_warps must be a power of 2 in [1, 32], "
                     f"got {config.num_warps!r}")
  if not isinstance(config.num_stages, int) or config.num_stages < 1:
    raise ValueError(f"{type(config).__name__}.num_stages must be a positive int, "
                     f"got {config.num_stages!r}")


def check_config(config: Any, kind: type) -> Any:
  """``config`` itself when it is None or a ``kind``; a TypeError naming both otherwise."""
  if config is not None and not isinstance(config, kind):
    article = "an" if kind.__name__[0] in "AEIOU" else "a"
    raise TypeError(f"config must be {article} {kind.__name__} or None, "
                    f"got {type(config).__name__}")
  return config


def _warps_for(elements: int, per_thread: int) -> int:
  """Warps so that each thread holds about ``per_thread`` elements (1..16 warps)."""
  warps = max(1, elements // (32 * per_thread))
  return min(16, next_power_of_2(warps))


@dataclasses.dataclass(frozen=True)
class ElementwiseConfig:
  """Tiling of pack / unpack / decode / init (row-block programs).

  Attributes:
    block_rows: rows per program.
    block_groups: groups (of four codes) per chunk of a row.
    num_warps: Triton warps per program.
    num_stages: software-pipelining depth of the chunk loop.
  """

  block_rows: int = 1
  block_groups: int = 256
  num_warps: int = 4
  num_stages: int = 1

  def __post_init__(self):
    _check_pow2(self, ("block_rows", "block_groups"))
    _check_warps_stages(self)

  @classmethod
  def get_heuristics_config(cls, shape: Sequence[int], dtype: Any = jnp.float32
                            ) -> "ElementwiseConfig":
    """A default for an ``(out, in)`` matrix (``dtype`` of the dense side).

    Example:
      >>> ElementwiseConfig.get_heuristics_config((37, 44))
      ElementwiseConfig(block_rows=64, block_groups=16, num_warps=4, num_stages=1)
    """
    del dtype  # Memory-bound on every dtype; the tile depends on the shape only.
    out_features, in_features = (int(d) for d in shape)
    groups = max(1, in_features // 4)
    block_groups = min(next_power_of_2(groups), 1024)
    block_rows = max(1, min(next_power_of_2(out_features), 1024 // block_groups))
    return cls(block_rows=block_rows, block_groups=block_groups,
               num_warps=_warps_for(block_rows * block_groups, 8), num_stages=1)


@dataclasses.dataclass(frozen=True)
class CounterUpdateConfig:
  """Tiling of the fused counter update on a dense gradient.

  Attributes:
    block_rows: rows per program.
    block_groups: groups per chunk; a row of ``in / 4`` groups in one chunk
      is updated in a single pass with the row in registers, otherwise in
      two passes.
    num_warps: Triton warps per program.
    num_stages: software-pipelining depth of the chunk loops.
    bitwise: codes -> float by an exact bit trick and ternary values by
      selects, instead of int -> float conversions (a quarter of the integer
      rate on NVIDIA GPUs); identical results.
    dense_grad: load the gradient tile as one contiguous ``(rows, groups, 4)``
      block (vectorisable) and split its lanes in registers, instead of four
      stride-4 loads.
  """

  block_rows: int = 1
  block_groups: int = 1024
  num_warps: int = 4
  num_stages: int = 1
  bitwise: bool = False
  dense_grad: bool = False

  def __post_init__(self):
    _check_pow2(self, ("block_rows", "block_groups"))
    _check_warps_stages(self)
    for name in ("bitwise", "dense_grad"):
      if not isinstance(getattr(self, name), bool):
        raise TypeError(f"CounterUpdateConfig.{name} must be a bool, got {getattr(self, name)!r}")

  @classmethod
  def get_heuristics_config(cls, shape: Sequence[int], dtype: Any = jnp.float32
                            ) -> "CounterUpdateConfig":
    """A default for an ``(out, in)`` gradient of ``dtype``.

    The update is memory-bound (it moves ``itemsize + 1.5`` bytes per weight),
    so the aim is whole rows in registers (one pass over the gradient) and
    about 1-4 K groups per program, ~8 groups (32 gradient values) per thread.

    Example:
      >>> config = CounterUpdateConfig.get_heuristics_config((4096, 4096))
      >>> config.block_rows, config.block_groups, config.num_warps, config.num_stages
      (1, 1024, 4, 1)
    """
    del dtype  # The per-thread footprint is in groups; itemsize only scales bytes.
    out_features, in_features = (int(d) for d in shape)
    groups = max(1, in_features // 4)
    block_groups = min(next_power_of_2(groups), _MAX_RESIDENT_GROUPS)
    if block_groups < groups:
      block_groups = 2048  # Two-pass: chunks small enough to keep the tile hot.
    block_rows = max(1, min(next_power_of_2(out_features), 1024 // block_groups))
    n_chunks = math.ceil(groups / block_groups)
    return cls(block_rows=block_rows, block_groups=block_groups,
               num_warps=_warps_for(block_rows * block_groups, 8),
               num_stages=2 if n_chunks > 1 else 1)

  @classmethod
  def candidates(cls, shape: Sequence[int], dtype: Any = jnp.float32
                 ) -> list["CounterUpdateConfig"]:
    """The heuristic, its bitwise / dense-gradient forms and multi-row tiles (autotuning)."""
    base = cls.get_heuristics_config(shape, dtype)
    fast = dataclasses.replace(base, bitwise=True, dense_grad=True)
    out = [base, dataclasses.replace(base, bitwise=True), fast,
           dataclasses.replace(fast, num_warps=min(16, base.num_warps * 2))]
    for rows in (2, 4):
      if rows * base.block_groups <= 8192 and rows <= next_power_of_2(int(shape[0])):
        out.append(dataclasses.replace(fast, block_rows=rows,
                                       num_warps=_warps_for(rows * base.block_groups, 8)))
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
  """

  block_rows: int = 32
  block_groups: int = 32
  block_m: int = 32
  num_warps: int = 4
  num_stages: int = 3
  allow_tf32: bool = False

  def __post_init__(self):
    _check_pow2(self, ("block_rows", "block_groups", "block_m"))
    _check_warps_stages(self)
    for name in ("block_rows", "block_groups", "block_m"):
      if getattr(self, name) < 16:
        raise ValueError(f"FromIOConfig.{name} must be >= 16 (Triton dot tiles), "
                         f"got {getattr(self, name)}")
    if not isinstance(self.allow_tf32, bool):
      raise TypeError(f"FromIOConfig.allow_tf32 must be a bool, got {self.allow_tf32!r}")

  def fused(self, in_features: int) -> bool:
    """True when one tile spans whole rows: statistics and update in one kernel."""
    return self.block_groups >= in_features // 4

  @classmethod
  def get_heuristics_config(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16
                            ) -> "FromIOConfig":
    """A default for ``(M, out, in)`` and the inputs' ``dtype``.

    Rows up to ``in = 512`` fit one tile (a single fused kernel); longer rows
    use ``32 x 128`` tiles in two kernels (statistics, then a recomputing
    update), each with ``out / 32 * in / 128`` programs.

    Example:
      >>> config = FromIOConfig.get_heuristics_config((4096, 4096, 4096), "bfloat16")
      >>> config.fused(4096), config.block_rows, 4 * config.block_groups
      (False, 32, 128)
    """
    m_rows, out_features, in_features = (int(d) for d in shape)
    groups = max(1, in_features // 4)
    itemsize = jnp.dtype(dtype).itemsize
    block_m = 32 if itemsize >= 4 else 64
    block_m = max(16, min(block_m, next_power_of_2(m_rows)))
    block_rows = max(16, min(32, next_power_of_2(out_features)))
    if next_power_of_2(groups) <= 128:
      block_groups = max(16, next_power_of_2(groups))
      block_rows = 16
    else:
      block_groups = 32
    accumulators = 4 * block_rows * block_groups
    return cls(block_rows=block_rows, block_groups=block_groups, block_m=block_m,
               num_warps=_warps_for(accumulators, 32), num_stages=3, allow_tf32=False)


@dataclasses.dataclass(frozen=True)
class MatmulConfig:
  """Tiling of the packed ternary matmul and its input gradient.

  Attributes:
    block_m: rows of ``x`` per tile (>= 16).
    block_n: output units per tile (>= 16); in the input-gradient kernel,
      the chunk of output units reduced per step.
    block_groups: groups (4 inputs each) per step of the ``in`` reduction; in
      the input-gradient kernel, the groups per output tile (>= 16).
    num_warps: Triton warps per program.
    num_stages: software-pipelining depth of the reduction loop.
    allow_tf32: let float32 inputs use TF32 tensor cores (codes are exact in
      any dtype; only ``x`` is rounded). False keeps float32 products exact.
  """

  block_m: int = 64
  block_n: int = 64
  block_groups: int = 16
  num_warps: int = 4
  num_stages: int = 3
  allow_tf32: bool = False

  def __post_init__(self):
    _check_pow2(self, ("block_m", "block_n", "block_groups"))
    _check_warps_stages(self)
    for name in ("block_m", "block_n", "block_groups"):
      if getattr(self, name) < 16:
        raise ValueError(f"MatmulConfig.{name} must be >= 16 (Triton dot tiles), "
                         f"got {getattr(self, name)}")
    if not isinstance(self.allow_tf32, bool):
      raise TypeError(f"MatmulConfig.allow_tf32 must be a bool, got {self.allow_tf32!r}")

  @classmethod
  def get_heuristics_config(cls, shape: Sequence[int], dtype: Any = jnp.bfloat16
                            ) -> "MatmulConfig":
    """A default for ``(M, out, in)`` and ``x``'s ``dtype``.

    Decode-sized ``M`` (<= 16) is memory-bound on the 0.75-byte codes: narrow
    output tiles for many programs and long reduction steps. Larger ``M`` uses
    GEMM tiles (64-128 square, 64-128 inputs per step).

    Example:
      >>> MatmulConfig.get_heuristics_config((1, 4096, 4096), "bfloat16").block_n
      32
    """
    m_rows, out_features, in_features = (int(d) for d in shape)
    del in_features
    itemsize = jnp.dtype(dtype).itemsize
    if m_rows <= 16:
      return cls(block_m=16, block_n=32, block_groups=64, num_warps=4, num_stages=3)
    if m_rows <= 64:
      return cls(block_m=max(16, next_power_of_2(m_rows)), block_n=64, block_groups=32,
                 num_warps=4, num_stages=3)
    block = 128 if (m_rows >= 1024 and out_features >= 1024 and itemsize <= 2) else 64
    return cls(block_m=block, block_n=block, block_groups=32 if block == 128 else 16,
               num_warps=8 if block == 128 else 4, num_stages=3)
