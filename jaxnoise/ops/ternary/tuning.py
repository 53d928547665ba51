"""Autotuning entry points of the ternary ops (packed matmul, counter updates).

Call one of these once, outside ``jit``, on representative concrete inputs;
afterwards the op picks the tuned config (when called with ``config=None``)
for inputs of the same shapes and dtypes, also under ``jit``. Every candidate
is first compared with the pure-JAX reference (:mod:`jaxnoise.ops.autotune`):
one that disagrees is excluded and recorded with its deviation, never dropped
silently. The deviation of a counter update is the fraction of codes that
differ from the reference (each by at most one; a code off by more, a scale or
``v`` off by more than 1e-4 relative, or a different skipped-row count is an
infinite deviation), screened against SPEC's 1e-4.

Candidates are timed eight calls per dispatch (one executable: matmuls on
copies of ``x``, updates with the state chained), so the time is the
kernels' and their launches', as inside a model's jitted step. One call per
dispatch timed the host instead: at 10-45 us per call the dispatch outlasts
the kernel, and the tuner picked configs up to 45% slower on the device
(H200, 2026-12-01).

Example:
  >>> import jax.numpy as jnp
  >>> from jaxnoise.ops import ternary
  >>> from jaxnoise.ops.ternary import tuning
  >>> packed, scale = ternary.ternary_init(jnp.ones((8, 32)), C=3)
  >>> record = tuning.tune_matmul(jnp.ones((2, 32)), packed, scale, C=3,
  ...     implementation="interpret", candidates=[None], repeats=1)
  >>> record.selected is not None
  True
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnoise.ops import _common
from jaxnoise.ops import autotune
from jaxnoise.ops.ternary import config as config_lib
from jaxnoise.ops.ternary import mosaic_gpu_matmul
from jaxnoise.ops.ternary import reference
from jaxnoise.ops.ternary._validation import _check_packed, _check_row_vector, check_C
from jaxnoise.ops.ternary.matmul import matmul_input_grad, ternary_matmul
from jaxnoise.ops.ternary.update import counter_update, counter_update_from_io

__all__ = ["tune_counter_update", "tune_counter_update_from_io", "tune_matmul",
           "tune_matmul_input_grad", "update_deviation"]

# Accepted relative deviation of the matmul from the float32 reference, by x's
# dtype (products of exact ternary values; only the reduction order and the
# output rounding differ).
_MATMUL_TOLERANCE = {
    jnp.dtype(jnp.float32): 1e-4,
    jnp.dtype(jnp.bfloat16): 1e-2,
    jnp.dtype(jnp.float16): 2e-3,
}
# SPEC section 3: at most 1e-4 of the codes, each off by one.
UPDATE_TOLERANCE = 1e-4


def _kernel_implementation(implementation: str) -> str:
  implementation = _common.resolve_implementation(implementation)
  if implementation == "reference":
    raise ValueError('the reference has nothing to tune: use implementation="pallas" (GPU) '
                     'or "interpret"')
  return implementation


def _resolve(candidates, heuristic):
  """``None`` entries stand for the heuristic config."""
  return [heuristic if c is None else c for c in candidates]


# Calls per timed dispatch (see autotune.tune's batched_run): one executable runs the op
# this many times, so a sample measures the kernels and their launches, not the host.
_BATCH_CALLS = 8


def _batched_matmul(op, implementation: str, x, packed, scale):
  """``batched_run`` of a matmul: one executable of _BATCH_CALLS products on copies of the operands.

  Each call reads its own copy of ``x`` and of ``packed`` (distinct
  parameters, so XLA merges nothing), as the layers of a model would. With
  shared weights XLA computed the decode method's ``t`` once for all calls
  (H200, 2026-12-02: the input-gradient tuner then picked a decode 1.2-2.8x
  slower than the heuristic in device time); an ``optimization_barrier`` per
  call did not stop that merge on CPU. The copies cost ``_BATCH_CALLS`` times
  the packed weights in memory while tuning.
  """
  xs = [jnp.array(x, copy=True) for _ in range(_BATCH_CALLS)]
  packs = [jnp.array(packed, copy=True) for _ in range(_BATCH_CALLS)]

  def batched_run(config):
    many = _many_matmuls(op, implementation, config)
    return lambda: many(xs, packs, scale)

  return batched_run


def _many_matmuls(op, implementation: str, config):
  """``(xs, packs, scale) -> [op(x_i, packed_i, scale)]``, jitted: one product per pair."""
  return jax.jit(lambda xs, packs, scale: [
      op(x_i, packed_i, scale, implementation=implementation, config=config)
      for x_i, packed_i in zip(xs, packs)])


def _batched_update(op, implementation: str, packed, scale, v, *operands):
  """``batched_run`` of an update: _BATCH_CALLS updates in one executable, the state chained."""

  def batched_run(config):
    def chain(packed, scale, v, *operands):
      for _ in range(_BATCH_CALLS):
        packed, scale, v, _ = op(packed, scale, v, *operands, implementation=implementation,
                                 config=config)
      return packed, scale, v

    many = jax.jit(chain)
    return lambda: many(packed, scale, v, *operands)

  return batched_run


def _jitted_per_config(op, implementation: str, *operands):
  """``run(config)``: ``op`` on ``operands``, jitted once per config.

  Under ``jit`` the op's checks of concrete values (every code in range, a
  positive scale) run at trace time only, so the timed calls are the kernels
  and not a host-side scan of the state.
  """
  compiled = {}

  def run(config):
    if config not in compiled:
      compiled[config] = jax.jit(functools.partial(op, implementation=implementation,
                                                   config=config))
    return compiled[config](*operands)

  return run


def update_deviation(result, expected) -> float:
  """Fraction of codes that differ between two update results (``inf`` past SPEC's bounds).

  Args:
    result: ``(packed, scale, v, skipped_rows)`` of the candidate.
    expected: the same of the reference.

  Returns:
    The fraction of differing codes, or ``inf`` when a code differs by more
    than one, ``scale`` or ``v`` by more than 1e-4 relative, or the skipped
    row counts differ.
  """
  codes = np.asarray(reference.unpack_codes_reference(jnp.asarray(result[0])), np.int64)
  ref_codes = np.asarray(reference.unpack_codes_reference(jnp.asarray(expected[0])), np.int64)
  diff = np.abs(codes - ref_codes)
  if diff.max(initial=0) > 1 or int(np.asarray(result[3])) != int(np.asarray(expected[3])):
    return float("inf")
  for got, want in ((result[1], expected[1]), (result[2], expected[2])):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if not np.all(np.abs(got - want) <= 1e-4 * np.maximum(np.abs(want), 1e-30)):
      return float("inf")
  return float((diff != 0).mean())


# The screen's scale step moves each row's scale by about this fraction of the mean scale.
_SCALE_MOVE = 0.01
# Rows of grad_out^T x formed to estimate the from-IO gradient's size.
_SAMPLED_ROWS = 64


def _update_hyper(C: int, scale, grad_rms: float) -> dict:
  """Hyperparameters for tuning: a step that moves most codes (a non-vacuous screen).

  The latent step ``lr * lv / d`` is about one code per unit of RMS-normalised
  gradient, so most codes move. The scale step is set against the gradient's
  size (``grad_rms``) so that ``s'`` moves by about 1% of the mean scale. A
  fixed ``lr_scale`` let a large gradient (``grad_out^T x`` over 1024 rows)
  drive some ``s'`` to the floor, where ``s / s'`` is huge and turns the last
  bit of a row sum, which legitimately differs between a kernel and the
  reference, into codes that differ by more than one: the screen then
  excluded every candidate (H200, 2026-12-01).
  """
  mean_scale = float(np.mean(np.abs(np.asarray(scale, np.float64))))
  grad_rms = float(grad_rms)
  if np.isfinite(grad_rms) and grad_rms > 0 and np.isfinite(mean_scale):
    lr_scale = _SCALE_MOVE * mean_scale / grad_rms
  else:  # A zero or non-finite gradient (its rows are skipped or keep their scale).
    lr_scale = _SCALE_MOVE
  return dict(C=C, lr=1.0 / reference.levels(C), lr_scale=lr_scale, rms_beta=0.9,
              rms_eps=1e-8, seed=12345)


def _rms(values) -> float:
  values = jnp.asarray(values, jnp.float32)
  return float(jnp.sqrt(jnp.mean(values * values)))


def _from_io_grad_rms(x, grad_out) -> float:
  """RMS of ``grad_out^T x`` from up to 64 evenly spaced of its rows (never formed whole)."""
  rows = np.unique(np.linspace(0, grad_out.shape[1] - 1, _SAMPLED_ROWS).astype(np.int64))
  sampled = jnp.einsum("mo,mi->oi", jnp.asarray(grad_out)[:, rows], jnp.asarray(x),
                       preferred_element_type=jnp.float32)
  return _rms(sampled)


def tune_counter_update(packed, scale, v, grad_w, *, C: int, lagged: bool = False,
                        implementation: str = "auto", candidates: Sequence[Any] | None = None,
                        tolerance: float = UPDATE_TOLERANCE,
                        repeats: int = 10) -> autotune.TuningRecord:
  """Tune :func:`jaxnoise.ops.ternary.counter_update` for ``grad_w``'s shape and dtype.

  The state is not modified (the candidates run without donation).

  Args:
    packed, scale, v, grad_w: as for the op (concrete arrays).
    C: counter half-width.
    lagged: as for the op.
    implementation: ``"auto"``, ``"pallas"`` or ``"interpret"``.
    candidates: configs to try (None: :meth:`CounterUpdateConfig.candidates`;
      a None entry stands for the heuristic).
    tolerance: accepted fraction of codes off by one.
    repeats: timed samples per candidate (each queues calls, see
      :mod:`jaxnoise.ops.autotune`).

  Returns:
    The tuning record (every candidate with its deviation and time).
  """
  implementation = _kernel_implementation(implementation)
  shape, dtype = tuple(grad_w.shape), grad_w.dtype
  heuristic = config_lib.CounterUpdateConfig.get_heuristics_config(shape, dtype)
  if candidates is None:
    candidates = config_lib.CounterUpdateConfig.candidates(shape, dtype)
  hyper = _update_hyper(C, scale, _rms(grad_w))
  op = functools.partial(counter_update, lagged=lagged, donate=False, **hyper)
  run = _jitted_per_config(op, implementation, packed, scale, v, grad_w)

  op_name, key = config_lib.counter_update_key(implementation, shape, dtype)
  return autotune.tune(
      op_name, key, _resolve(candidates, heuristic), run,
      lambda: tuple(op(packed, scale, v, grad_w, implementation="reference")), tolerance,
      repeats=repeats, deviation=update_deviation,
      batched_run=_batched_update(op, implementation, packed, scale, v, grad_w),
      batch_calls=_BATCH_CALLS)


def tune_counter_update_from_io(packed, scale, v, x, grad_out, *, C: int, lagged: bool = False,
                                implementation: str = "auto",
                                candidates: Sequence[Any] | None = None,
                                tolerance: float = UPDATE_TOLERANCE,
                                repeats: int = 10) -> autotune.TuningRecord:
  """Tune :func:`jaxnoise.ops.ternary.counter_update_from_io` for these shapes and dtypes.

  ``x`` and ``grad_out`` are ``(M, in)`` and ``(M, out)`` (2-D, as the op
  flattens them). Arguments as :func:`tune_counter_update`; the candidates
  default to :meth:`FromIOConfig.candidates`.
  """
  implementation = _kernel_implementation(implementation)
  m_rows, in_features = x.shape
  out_features = grad_out.shape[1]
  dtype = jnp.promote_types(x.dtype, grad_out.dtype)
  shape = (m_rows, out_features, in_features)
  heuristic = config_lib.FromIOConfig.get_heuristics_config(shape, dtype)
  if candidates is None:
    candidates = config_lib.FromIOConfig.candidates(shape, dtype)
  hyper = _update_hyper(C, scale, _from_io_grad_rms(x, grad_out))
  op = functools.partial(counter_update_from_io, lagged=lagged, donate=False, **hyper)
  run = _jitted_per_config(op, implementation, packed, scale, v, x, grad_out)

  op_name, key = config_lib.from_io_key(implementation, m_rows, out_features, in_features, dtype)
  return autotune.tune(
      op_name, key, _resolve(candidates, heuristic), run,
      lambda: tuple(op(packed, scale, v, x, grad_out, implementation="reference")), tolerance,
      repeats=repeats, deviation=update_deviation,
      batched_run=_batched_update(op, implementation, packed, scale, v, x, grad_out),
      batch_calls=_BATCH_CALLS)


def tune_matmul(x, packed, scale, *, C: int, out_dtype: Any = None,
                implementation: str = "auto", candidates: Sequence[Any] | None = None,
                tolerance: float | None = None, repeats: int = 10) -> autotune.TuningRecord:
  """Tune :func:`jaxnoise.ops.ternary.ternary_matmul` for ``x``'s shape and dtype.

  Args:
    x: ``(M, in)`` input (2-D, as the op flattens it).
    packed, scale, C, out_dtype: as for the op.
    implementation: ``"auto"``, ``"pallas"`` or ``"interpret"``.
    candidates: configs to try (None: :meth:`MatmulConfig.candidates`; a
      None entry stands for the heuristic).
    tolerance: accepted ``max|y - ref| / max|ref|`` (None: by ``x``'s dtype).
    repeats: timed samples per candidate (each queues calls, see
      :mod:`jaxnoise.ops.autotune`).

  Returns:
    The tuning record.
  """
  implementation = _kernel_implementation(implementation)
  out_dtype = jnp.dtype(x.dtype if out_dtype is None else out_dtype)
  m_rows, in_features = x.shape
  out_features = packed.shape[0]
  shape = (m_rows, out_features, in_features)
  wgmma = mosaic_gpu_matmul.unsupported_reason(*shape, x.dtype,
                                               implementation == "interpret") is None
  heuristic = config_lib.MatmulConfig.get_heuristics_config(shape, x.dtype, wgmma=wgmma)
  if candidates is None:
    candidates = config_lib.MatmulConfig.candidates(shape, x.dtype, wgmma=wgmma)
  return _tune_product(
      functools.partial(ternary_matmul, C=C, out_dtype=out_dtype),
      config_lib.matmul_key(implementation, m_rows, out_features, in_features, x.dtype,
                            out_dtype),
      x, packed, scale, implementation=implementation,
      candidates=_resolve(candidates, heuristic), tolerance=tolerance, repeats=repeats)


def _tune_product(op, op_and_key, operand, packed, scale, *, implementation: str, candidates,
                  tolerance: float | None, repeats: int) -> autotune.TuningRecord:
  """Tunes ``op(operand, packed, scale)``: the packed matmul or its input gradient."""
  if tolerance is None:
    tolerance = _MATMUL_TOLERANCE.get(jnp.dtype(operand.dtype), 1e-2)
  return autotune.tune(
      *op_and_key, candidates, _jitted_per_config(op, implementation, operand, packed, scale),
      lambda: op(operand, packed, scale, implementation="reference"), tolerance,
      repeats=repeats, batched_run=_batched_matmul(op, implementation, operand, packed, scale),
      batch_calls=_BATCH_CALLS)


def tune_matmul_input_grad(grad_y, packed, scale, *, C: int, out_dtype: Any = None,
                           implementation: str = "auto",
                           candidates: Sequence[Any] | None = None,
                           tolerance: float | None = None,
                           repeats: int = 10) -> autotune.TuningRecord:
  """Tune the input gradient of :func:`jaxnoise.ops.ternary.ternary_matmul`'s VJP.

  ``jax.grad`` through the matmul then takes the selected config for an
  output gradient of this shape and dtype (``out_dtype`` is ``x``'s dtype in
  the VJP).

  Args:
    grad_y: ``(M, out)`` output gradient (2-D, as the op flattens it).
    packed, scale, C: as for the op.
    out_dtype: the gradient's dtype (``x``'s in the VJP; default ``grad_y``'s).
    implementation: ``"auto"``, ``"pallas"`` or ``"interpret"``.
    candidates: configs to try (None: :meth:`MatmulConfig.input_grad_candidates`;
      a None entry stands for the heuristic).
    tolerance: accepted ``max|g - ref| / max|ref|`` (None: by ``grad_y``'s
      dtype; 16-bit ``grad_y * scale`` is rounded before the dot).
    repeats: timed samples per candidate.

  Returns:
    The tuning record.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxnoise.ops import ternary
    >>> packed, scale = ternary.ternary_init(jnp.ones((8, 32)), C=3)
    >>> record = tune_matmul_input_grad(jnp.ones((2, 8)), packed, scale, C=3,
    ...     implementation="interpret", candidates=[None], repeats=1)
    >>> record.selected.method
    'decode'
  """
  implementation = _kernel_implementation(implementation)
  packed = _check_packed(packed)
  grad_y = _common.check_float_array(grad_y, "grad_y", (2,))
  out_features, in_features = packed.shape[0], 4 * (packed.shape[1] // 3)
  if grad_y.shape[1] != out_features:
    raise ValueError(f"grad_y must be (M, out={out_features}) for packed "
                     f"{_common.describe(packed)}; got grad_y {_common.describe(grad_y)}")
  scale = _check_row_vector(scale, "scale", out_features, packed, _common.FLOAT_DTYPES)
  C = check_C(C)
  out_dtype = jnp.dtype(grad_y.dtype if out_dtype is None else out_dtype)
  m_rows = grad_y.shape[0]
  shape = (m_rows, in_features, out_features)
  heuristic = config_lib.MatmulConfig.get_input_grad_heuristics_config(shape, grad_y.dtype)
  if candidates is None:
    candidates = config_lib.MatmulConfig.input_grad_candidates(shape, grad_y.dtype)
  return _tune_product(
      functools.partial(matmul_input_grad, C=C, out_dtype=out_dtype),
      config_lib.matmul_input_grad_key(implementation, m_rows, in_features, out_features,
                                       grad_y.dtype, out_dtype),
      grad_y, packed, scale, implementation=implementation,
      candidates=_resolve(candidates, heuristic), tolerance=tolerance, repeats=repeats)
