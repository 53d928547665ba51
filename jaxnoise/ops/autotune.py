"""Autotuning with a correctness screen.

A small config space per op is tried once per ``(op, key)`` (the key holds
the shapes, dtypes and static options), outside of tracing, on concrete
inputs. Every candidate's output is first compared with the op's reference
(the pure-JAX implementation at full float32 precision); a candidate whose
deviation ``max|out - ref| / max|ref|`` exceeds the tolerance, or that fails
to compile or run, is *excluded* and recorded with its deviation or error,
never dropped silently. The survivors are timed (median of ``repeats``
samples after warm-up, taken in rounds over all survivors; each sample
queues enough calls that host dispatch overlaps device work) and the
fastest is cached: later calls of the op with
``config=None`` and the same key use it, also under ``jit``. Untuned keys use
the op's heuristic config.

Inspect what happened with :func:`records`; forget it with :func:`clear`.
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import jax
import numpy as np

__all__ = ["CandidateResult", "TuningRecord", "clear", "lookup", "records", "tune"]

_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class CandidateResult:
  """One candidate's fate.

  Attributes:
    config: the candidate config.
    status: ``"selected"``, ``"timed"`` (correct, slower), ``"excluded"``
      (deviation above tolerance, or non-finite output) or ``"failed"``
      (did not compile or run).
    deviation: ``max|out - ref| / max|ref|`` (None if it failed).
    seconds: median seconds per call (None unless timed).
    error: the exception text for failed candidates.
  """

  config: Any
  status: str
  deviation: float | None = None
  seconds: float | None = None
  error: str | None = None


@dataclasses.dataclass(frozen=True)
class TuningRecord:
  """The outcome of tuning one ``(op, key)``."""

  op: str
  key: Hashable
  tolerance: float
  selected: Any
  candidates: tuple[CandidateResult, ...]

  @property
  def excluded(self) -> tuple[CandidateResult, ...]:
    return tuple(c for c in self.candidates if c.status in ("excluded", "failed"))


_CACHE: dict[tuple[str, Hashable], Any] = {}
_RECORDS: dict[tuple[str, Hashable], TuningRecord] = {}


def lookup(op: str, key: Hashable) -> Any:
  """The tuned config of ``(op, key)``, or None if it was never tuned."""
  return _CACHE.get((op, key))


def records() -> list[TuningRecord]:
  """Every tuning outcome so far, in order."""
  return list(_RECORDS.values())


def clear() -> None:
  """Forget every tuned config and record."""
  _CACHE.clear()
  _RECORDS.clear()


def _deviation(value, ref: np.ndarray) -> float:
  value = np.asarray(value, np.float64)
  if value.shape != ref.shape or not np.all(np.isfinite(value)):
    return float("inf")
  scale = max(float(np.abs(ref).max()), np.finfo(np.float32).tiny)
  return float(np.abs(value - ref).max() / scale)


# A timed sample queues calls until it spans about this long (at most
# _MAX_QUEUED calls), so the host's dispatch of one call overlaps the device's
# work on the previous ones: a call shorter than its dispatch (tens of
# microseconds) would otherwise time the host, the same for every candidate.
_SAMPLE_SECONDS = 2e-3
_MAX_QUEUED = 64


def _calls_per_sample(fn: Callable[[], Any], warmup: int) -> int:
  """Warms ``fn`` up and returns how many queued calls span about one sample."""
  for _ in range(warmup):
    jax.block_until_ready(fn())
  start = time.perf_counter()
  jax.block_until_ready(fn())
  single = time.perf_counter() - start
  return max(1, min(_MAX_QUEUED, int(_SAMPLE_SECONDS / max(single, 1e-9))))


def _sample_seconds(fn: Callable[[], Any], queued: int) -> float:
  """Seconds per call over ``queued`` calls dispatched back to back."""
  start = time.perf_counter()
  for _ in range(queued):
    out = fn()  # One device stream runs the calls in order: the last one ends the sample.
  jax.block_until_ready(out)
  return (time.perf_counter() - start) / queued


def _interleaved_medians(fns: Sequence[Callable[[], Any]], warmup: int,
                         repeats: int) -> list[float]:
  """Median seconds per call of each of ``fns``, their samples taken in rotating rounds.

  Round ``r`` takes one sample of every function, starting at a different one
  each round, so a drift of the machine (clocks, caches, the allocator
  warming up) spreads over all of them instead of falling on whichever runs
  first. (On an H200, 2026-12-01, the first candidate still measured slower
  by wall clock than its device time in some cases, so drift was not the
  whole cause of that gap; timing several calls per dispatch, ``batched_run``
  in :func:`tune`, is what made the picks right in device time.)
  """
  queued = [_calls_per_sample(fn, warmup) for fn in fns]
  samples: list[list[float]] = [[] for _ in fns]
  for round_index in range(repeats):
    for offset in range(len(fns)):
      i = (round_index + offset) % len(fns)
      samples[i].append(_sample_seconds(fns[i], queued[i]))
  return [statistics.median(times) for times in samples]


def tune(op: str, key: Hashable, candidates: Sequence[Any], run: Callable[[Any], Any],
         reference: Callable[[], Any], tolerance: float, *, warmup: int = 2,
         repeats: int = 10,
         deviation: Callable[[Any, Any], float] | None = None,
         batched_run: Callable[[Any], Callable[[], Any]] | None = None,
         batch_calls: int = 1) -> TuningRecord:
  """Screen, time and cache the candidates of one ``(op, key)``.

  Args:
    op: the op's name.
    key: hashable description of the shapes, dtypes and static options.
    candidates: configs to try (duplicates are tried once).
    run: ``run(config)`` computes the op on the tuning inputs (it should be
      jitted so timing excludes tracing); must be called on concrete inputs.
    reference: computes the reference output once.
    tolerance: the largest accepted deviation from the reference.
    warmup: untimed calls per candidate (compilation included).
    repeats: timed samples per candidate (each queues enough calls to span
      about 2 ms; one sample of every candidate per round); the median
      seconds per call is kept.
    deviation: ``deviation(output, reference_output) -> float`` (None:
      ``max|out - ref| / max|ref|`` on float64 copies). Ops whose outputs are
      not plain floats (packed codes) supply their own measure.
    batched_run: ``batched_run(config)`` returns a function that runs the op
      ``batch_calls`` times in one dispatch (one executable, on distinct
      inputs or a chained state so XLA cannot merge the calls); timing then
      uses it. For calls of tens of microseconds the host's dispatch of each
      call outlasts the kernel, and timing ``run`` alone measures the host.
    batch_calls: calls per ``batched_run`` invocation (the time is divided
      by it).

  Returns:
    The :class:`TuningRecord`; its ``selected`` config is now cached.

  Raises:
    RuntimeError: when no candidate passes the screen (the record of every
      candidate is kept, see :func:`records`).
  """
  if deviation is None:
    ref = np.asarray(reference(), np.float64)
    deviation = _deviation
  else:
    ref = jax.device_get(reference())
  results, seen = [], set()
  for config in candidates:
    if config in seen:
      continue
    seen.add(config)
    try:
      measured = float(deviation(run(config), ref))
    except Exception as error:  # pylint: disable=broad-except
      results.append(CandidateResult(config, "failed", error=f"{type(error).__name__}: {error}"))
      _log.warning("autotune %s %s: %s failed: %s", op, key, config, error)
      continue
    if not measured <= tolerance:
      results.append(CandidateResult(config, "excluded", deviation=measured))
      _log.warning("autotune %s %s: %s excluded, deviation %.3g > %.3g", op, key, config,
                   measured, tolerance)
      continue
    results.append(CandidateResult(config, "timed", deviation=measured))
  timed_at = [i for i, r in enumerate(results) if r.status == "timed"]
  if batched_run is None:
    timed_fns = [lambda config=results[i].config: run(config) for i in timed_at]
    batch_calls = 1
  else:
    timed_fns = [batched_run(results[i].config) for i in timed_at]
  medians = _interleaved_medians(timed_fns, warmup, repeats)
  for i, seconds in zip(timed_at, medians):
    results[i] = dataclasses.replace(results[i], seconds=seconds / batch_calls)
  timed = [r for r in results if r.status == "timed"]
  if not timed:
    record = TuningRecord(op, key, tolerance, None, tuple(results))
    _RECORDS[(op, key)] = record
    raise RuntimeError(f"autotune {op} {key}: no candidate passed the correctness screen: "
                       f"{[(r.config, r.status, r.deviation, r.error) for r in results]}")
  best = min(timed, key=lambda r: r.seconds)
  results = [dataclasses.replace(r, status="selected") if r is best else r for r in results]
  record = TuningRecord(op, key, tolerance, best.config, tuple(results))
  _CACHE[(op, key)] = best.config
  _RECORDS[(op, key)] = record
  return record
