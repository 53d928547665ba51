"""Shared benchmark harness: timing, device facts, budgets, JSON and tables."""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp


def device_facts() -> dict[str, Any]:
  """What the numbers were measured on."""
  device = jax.devices()[0]
  return {
      "date": time.strftime("%Y-%m-%d"),
      "device": getattr(device, "device_kind", str(device)),
      "backend": jax.default_backend(),
      "jax": jax.__version__,
      "python": platform.python_version(),
      "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
  }


def median_time(fn: Callable, *args, warmup: int = 2, repeats: int = 10, inner: int = 3,
                max_seconds: float = 20.0) -> float:
  """Median seconds per call of a jitted ``fn`` over ``repeats`` timed groups.

  Each group queues ``inner`` calls (asynchronous dispatch keeps the device
  busy) and blocks once, so host dispatch overhead is amortised. ``warmup``
  calls (compilation included) are not timed. The number of groups shrinks
  when one call is long, keeping a case under ``max_seconds``; a call's
  length is taken from the warm-up calls after the first, so a slow compile
  does not shrink the groups of a fast call (it did before 2026-12-02, and
  the wall-clock column then timed one blocking call where compiles were
  slow, such as the fused low-rank forward's).
  """
  out = fn(*args)
  jax.block_until_ready(out)
  start = time.perf_counter()
  for _ in range(max(1, warmup - 1)):
    out = fn(*args)
    jax.block_until_ready(out)
  per_call = (time.perf_counter() - start) / max(1, warmup - 1)
  if per_call * repeats * inner > max_seconds:
    inner = 1
    repeats = max(10, min(repeats, int(max_seconds / max(per_call, 1e-9))))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(inner):
      out = fn(*args)
    jax.block_until_ready(out)
    times.append((time.perf_counter() - t0) / inner)
  del out
  return statistics.median(times)


def copy_bandwidth(n_bytes: int = 1 << 31) -> float:
  """Device-to-device copy bandwidth in bytes/s (bytes read + bytes written)."""
  x = jnp.ones((n_bytes // 4,), jnp.float32)
  copy = jax.jit(lambda a: a + 1.0)
  seconds = median_time(copy, x, repeats=10, inner=3)
  return 2 * n_bytes / seconds


class Budget:
  """Stops starting new cases once a wall-clock budget is spent."""

  def __init__(self, seconds: float):
    self.deadline = time.perf_counter() + seconds

  def left(self) -> float:
    return self.deadline - time.perf_counter()

  def ok(self) -> bool:
    return self.left() > 0


def run_case(results: list, name: str, fn: Callable[[], dict], budget: Budget | None = None):
  """Run one case, append its record (or its error), never raise."""
  if budget is not None and not budget.ok():
    results.append({"case": name, "skipped": "time budget spent"})
    print(f"[skip] {name}: time budget spent", flush=True)
    return None
  t0 = time.perf_counter()
  try:
    record = {"case": name, **fn()}
  except Exception as error:  # pylint: disable=broad-except
    record = {"case": name, "error": f"{type(error).__name__}: {error}"[:2000]}
    traceback.print_exc()
  record["wall_s"] = round(time.perf_counter() - t0, 2)
  results.append(record)
  print(json.dumps(record), flush=True)
  return record


@functools.cache
def frozen_module(path: str):
  """The module at ``path`` (a frozen copy of an earlier kernel state), imported once.

  Before/after benchmarks carry such copies (ignored by git) to the GPU and
  time them beside today's kernels in the same run.
  """
  spec = importlib.util.spec_from_file_location(f"frozen_{abs(hash(path))}", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # dataclasses look their module up
  spec.loader.exec_module(module)
  return module


def write_json(path: str, payload: Any) -> None:
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    json.dump(payload, f, indent=1, default=str)


def table(rows: list[dict], columns: list[str]) -> str:
  """A plain-text table of ``rows`` (missing cells blank)."""
  def cell(value):
    if isinstance(value, float):
      return f"{value:.3g}"
    return "" if value is None else str(value)
  grid = [columns] + [[cell(row.get(c)) for c in columns] for row in rows]
  widths = [max(len(r[i]) for r in grid) for i in range(len(columns))]
  lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)) for r in grid]
  lines.insert(1, "  ".join("-" * w for w in widths))
  return "\n".join(lines)


def device_busy(fn: Callable, *args, calls: int = 20,
                arg_sets: list[tuple] | None = None) -> dict[str, Any] | None:
  """Device time per call of a jitted ``fn``: the sum of its kernels' durations.

  Kernel activity comes from CUPTI through ``torch.profiler`` (which records
  every kernel of the process, JAX's included), so host dispatch and launch
  gaps are left out: ``busy_ms`` is what the GPU spends per call, and
  ``kernels`` splits it by kernel name (ms per call). Returns None where
  PyTorch with CUDA is not installed (no GPU, or the CPU machine).

  ``arg_sets`` (instead of ``args``) gives each call its own arguments, for a
  ``fn`` that donates them: the first set warms up, the others are profiled
  (all are made before profiling starts, so making them is not counted).
  """
  try:
    import torch  # pylint: disable=g-import-not-at-top
    from torch.profiler import ProfilerActivity, profile  # pylint: disable=g-import-not-at-top
  except ImportError:
    return None
  if not torch.cuda.is_available() or jax.default_backend() != "gpu":
    return None
  if arg_sets is None:
    arg_sets = [args] * (calls + 1)
  calls = len(arg_sets) - 1
  if calls < 1:
    raise ValueError(f"device_busy needs at least 2 arg_sets (warm-up + one call), got "
                     f"{len(arg_sets)}")
  jax.block_until_ready(arg_sets)
  jax.block_until_ready(fn(*arg_sets[0]))
  with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for call_args in arg_sets[1:]:
      jax.block_until_ready(fn(*call_args))
  kernels: dict[str, float] = {}
  for event in prof.events():
    if str(getattr(event, "device_type", "")).endswith("CUDA") and event.device_time > 0:
      name = event.name[:60]
      kernels[name] = kernels.get(name, 0.0) + event.device_time / 1e3 / calls
  if not kernels:
    return None
  return {"busy_ms": sum(kernels.values()), "kernels": kernels}
