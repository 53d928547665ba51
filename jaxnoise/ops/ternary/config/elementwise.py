"""Tiling of pack / unpack / decode / init: :class:`ElementwiseConfig`."""

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

__all__ = ["ElementwiseConfig"]


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
