"""Shared pieces of the ternary configs: power-of-2 checks, warps, the type check."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


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
