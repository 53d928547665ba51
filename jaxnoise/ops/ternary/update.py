"""The counter updates: :func:`counter_update` (dense gradient) and :func:`counter_update_from_io`.

In-place updates: both *donate* ``packed``, ``scale`` and ``v`` by default
(``donate=True``): the kernels write the new state into the same buffers
(``input_output_aliases``), and the arrays passed in must not be used after
the call. Pass ``donate=False`` to keep them (the outputs are then fresh
buffers). Inside an outer ``jax.jit`` donation is decided by that jit's own
``donate_argnums``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxnoise.ops import _common
from jaxnoise.ops import autotune
from jaxnoise.ops.ternary import config as config_lib
from jaxnoise.ops.ternary import reference
from jaxnoise.ops.ternary._validation import (
    _check_in_features,
    _check_state,
    _hyper,
    _kernels,
    _run,
    check_C,
    check_packed_codes,
    check_seed,
    check_state_values,
)
from jaxnoise.ops.ternary.config import CounterUpdateConfig, FromIOConfig, check_config

__all__ = ["CounterUpdateResult", "TernaryGrad", "counter_update", "counter_update_from_io"]


class CounterUpdateResult(NamedTuple):
  """What a counter update returns (a tuple: unpack it as ``packed, scale, v, skipped``).

  Attributes:
    packed: ``(out, 3 * in // 4)`` uint8 new codes.
    scale: ``(out,)`` float32 new scale.
    v: ``(out,)`` float32 new RMS state.
    skipped_rows: ``()`` int32, rows left unchanged because their gradient
      (or its sum of squares) was not finite.
  """

  packed: jax.Array
  scale: jax.Array
  v: jax.Array
  skipped_rows: jax.Array


class TernaryGrad(NamedTuple):
  """A linear layer's counter-training gradient as its input and output gradient.

  The weight gradient is ``grad_out^T @ x``; :func:`counter_update_from_io`
  consumes the pair without forming it.

  Attributes:
    x: ``(M, in)`` layer input (all calls of the layer, rows concatenated).
    grad_out: ``(M, out)`` gradient of the layer output, same rows.
  """

  x: jax.Array
  grad_out: jax.Array


# ----------------------------------------------------------------------------
# Counter updates.


@dataclasses.dataclass(frozen=True)
class _UpdateStatic:
  C: int
  lagged: bool
  implementation: str
  config: Any


def _update_impl(static: _UpdateStatic, packed, scale, v, grad_w, hyper, seed):
  if static.implementation == "reference":
    packed, scale, v, skipped = reference.counter_update_reference(
        packed, scale, v, grad_w, hyper, seed[0], C=static.C, lagged=static.lagged)
  else:
    config = static.config
    if config is None:  # A tuned config for this shape, if any (else the kernel's heuristic).
      config = autotune.lookup(*config_lib.counter_update_key(
          static.implementation, grad_w.shape, grad_w.dtype))
    packed, scale, v, skipped = _kernels("update").counter_update(
        packed, scale, v, grad_w, hyper, seed, C=static.C, lagged=static.lagged,
        config=config, interpret=static.implementation == "interpret")
  return CounterUpdateResult(packed, scale, v, jnp.sum(skipped, dtype=jnp.int32))


def _from_io_impl(static: _UpdateStatic, packed, scale, v, x, grad_out, hyper, seed):
  if static.implementation == "reference":
    packed, scale, v, skipped = reference.counter_update_from_io_reference(
        packed, scale, v, x, grad_out, hyper, seed[0], C=static.C, lagged=static.lagged)
  else:
    config = static.config
    if config is None:
      config = autotune.lookup(*config_lib.from_io_key(
          static.implementation, x.shape[0], grad_out.shape[1], x.shape[1],
          jnp.promote_types(x.dtype, grad_out.dtype)))
    packed, scale, v, skipped = _kernels("update").counter_update_from_io(
        packed, scale, v, x, grad_out, hyper, seed, C=static.C, lagged=static.lagged,
        config=config, interpret=static.implementation == "interpret")
  return CounterUpdateResult(packed, scale, v, jnp.sum(skipped, dtype=jnp.int32))


_update_donating = jax.jit(_update_impl, static_argnums=0, donate_argnums=(1, 2, 3))
_update_copying = jax.jit(_update_impl, static_argnums=0)
_from_io_donating = jax.jit(_from_io_impl, static_argnums=0, donate_argnums=(1, 2, 3))
_from_io_copying = jax.jit(_from_io_impl, static_argnums=0)


def counter_update(
    packed: jax.Array,
    scale: jax.Array,
    v: jax.Array,
    grad_w: jax.Array,
    *,
    C: int,
    lr: float | jax.Array,
    lr_scale: float | jax.Array,
    rms_beta: float | jax.Array,
    rms_eps: float | jax.Array,
    seed: int | jax.Array,
    lagged: bool = False,
    implementation: str = "auto",
    config: CounterUpdateConfig | None = None,
    donate: bool = True,
) -> CounterUpdateResult:
  """One RMS-normalised, stochastically rounded counter update (SPEC section 3).

  Per row (output unit) with gradient ``g``::

      v'     = rms_beta * v + (1 - rms_beta) * mean(g**2)
      d      = max(sqrt(v if lagged else v'), rms_eps)
      grad_s = sum(g * t) / sqrt(in)
      s'     = clip(s - lr_scale * grad_s, 1e-5, 10)
      p'     = p * (s / s') - lr * g / d
      c'     = clip(floor((p' + 1.5) * lv - 0.5 + u), 0, 3 * lv - 1)

  with ``u`` in ``[0, 1)`` hashed from ``(seed, row * in + col)``: change
  ``seed`` every step. The rounding is unbiased, and a zero gradient with an
  unchanged scale leaves every code unchanged.

  Non-finite gradients: a row whose ``g`` holds a NaN or inf (or whose sum of
  squares overflows) keeps its codes, scale and ``v``; such rows are counted
  in ``skipped_rows``. Nothing non-finite reaches the state.

  Invalid state: codes outside ``C``'s range, a non-finite or non-positive
  ``scale`` or a negative or non-finite ``v`` raise ``ValueError`` when
  concrete. Traced (inside ``jit``), rows with an invalid ``scale`` or ``v``
  are skipped and counted in ``skipped_rows``, and out-of-range codes are
  clipped into range; :func:`jaxnoise.checks.checkify` turns both into
  run-time errors.

  Args:
    packed: ``(out, 3 * in // 4)`` uint8 codes (donated when ``donate``).
    scale: ``(out,)`` float32 row scale (donated when ``donate``).
    v: ``(out,)`` float32 RMS state (donated when ``donate``).
    grad_w: ``(out, in)`` float32 / bfloat16 / float16 weight gradient.
    C: counter half-width in ``1..11`` (``lv = 2C - 1`` codes per ternary value).
    lr: step in latent units per RMS-normalised gradient (may be traced).
    lr_scale: step of the scale (may be traced).
    rms_beta: RMS decay in ``[0, 1]``.
    rms_eps: positive floor of the RMS denominator.
    seed: integer seed of this step's rounding (int or uint32 scalar; ints
      wrap modulo 2**32).
    lagged: use the previous ``v`` in the denominator.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel tiling (:class:`CounterUpdateConfig`) or None (a tuned config
      if :func:`jaxnoise.ops.ternary.tuning.tune_counter_update` ran for this
      shape and dtype, else the heuristic).
    donate: update ``packed``, ``scale`` and ``v`` in place (their buffers are
      reused; do not touch the inputs afterwards).

  Returns:
    :class:`CounterUpdateResult` ``(packed, scale, v, skipped_rows)``.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxnoise.ops.ternary import ternary_init
    >>> packed, scale = ternary_init(jnp.ones((2, 8)), C=4)
    >>> v = jnp.zeros(2)
    >>> new = counter_update(packed, scale, v, jnp.zeros((2, 8)), C=4, lr=0.1,
    ...                      lr_scale=0.0, rms_beta=0.9, rms_eps=1e-8, seed=0,
    ...                      donate=False)
    >>> bool((new.packed == packed).all()), int(new.skipped_rows)
    (True, 0)
  """
  packed, scale, v = _check_state(packed, scale, v)
  grad_w = _common.check_float_array(grad_w, "grad_w", (2,))
  in_features = 4 * (packed.shape[1] // 3)
  _check_in_features(grad_w.shape[1], "grad_w", grad_w)
  if grad_w.shape != (packed.shape[0], in_features):
    raise ValueError(
        f"grad_w must have shape (out, in) = {(packed.shape[0], in_features)} to match packed "
        f"{_common.describe(packed)}; got grad_w {_common.describe(grad_w)}")
  static = _UpdateStatic(check_C(C), bool(lagged), _common.resolve_implementation(implementation),
                         check_config(config, CounterUpdateConfig))
  check_packed_codes(packed, static.C)
  check_state_values(scale, v)
  hyper = _hyper(lr, lr_scale, rms_beta, rms_eps)
  fn = _update_donating if donate else _update_copying
  return _run(static.implementation, fn, static, packed, scale, v, grad_w, hyper,
              check_seed(seed))


def counter_update_from_io(
    packed: jax.Array,
    scale: jax.Array,
    v: jax.Array,
    x: jax.Array,
    grad_out: jax.Array,
    *,
    C: int,
    lr: float | jax.Array,
    lr_scale: float | jax.Array,
    rms_beta: float | jax.Array,
    rms_eps: float | jax.Array,
    seed: int | jax.Array,
    lagged: bool = False,
    implementation: str = "auto",
    config: FromIOConfig | None = None,
    donate: bool = True,
) -> CounterUpdateResult:
  """:func:`counter_update` with ``grad_w = grad_out^T x`` formed inside the kernel.

  For a linear layer ``y = x @ W^T`` the weight gradient is
  ``grad_out^T @ x``; the kernel forms it tile by tile in registers and
  applies the update, so the dense ``(out, in)`` gradient never exists in
  memory (the reference forms it densely). This is a *memory* play: rows that
  fit one tile (``in <= 512`` by default) are formed once, longer rows are
  formed twice (statistics pass, then update pass), and the tiles are a
  hand-written GEMM. Expect it to be slower than a cuBLAS gradient plus the
  fused :func:`counter_update` (on an H200, 4096x4096 bf16: 1.86x at 4096
  rows of ``x``, 1.44x at 256, with 0.5-1 MiB of temporaries against 96 MiB);
  use it when the ``(out, in)`` float gradient does not fit or its traffic
  matters. ``FromIOConfig(xla_gemm_rows=R)`` sits between the two: XLA's
  GEMM forms ``R`` rows at a time and the dense kernel updates them (1.19x
  with 56 MiB at ``R = 1024``). ``benchmarks/bench_ternary.py`` measures all
  three.

  Args:
    packed: ``(out, 3 * in // 4)`` uint8 codes (donated when ``donate``).
    scale: ``(out,)`` float32 row scale (donated when ``donate``).
    v: ``(out,)`` float32 RMS state (donated when ``donate``).
    x: ``(..., in)`` layer input (leading dims are flattened into ``M``).
    grad_out: ``(..., out)`` gradient of the layer output, same leading dims.
    C: counter half-width in ``1..11``.
    lr: latent step (may be traced).
    lr_scale: scale step (may be traced).
    rms_beta: RMS decay in ``[0, 1]``.
    rms_eps: positive floor of the RMS denominator.
    seed: integer seed of this step's rounding.
    lagged: use the previous ``v`` in the denominator.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel tiling (:class:`FromIOConfig`) or None (tuned by
      :func:`jaxnoise.ops.ternary.tuning.tune_counter_update_from_io`, else the
      heuristic).
    donate: update ``packed``, ``scale`` and ``v`` in place.

  Returns:
    :class:`CounterUpdateResult` ``(packed, scale, v, skipped_rows)``.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxnoise.ops.ternary import ternary_init
    >>> packed, scale = ternary_init(jnp.ones((3, 8)), C=4)
    >>> new = counter_update_from_io(packed, scale, jnp.zeros(3), jnp.ones((5, 8)),
    ...                              jnp.ones((5, 3)), C=4, lr=0.5, lr_scale=0.0,
    ...                              rms_beta=0.0, rms_eps=1e-8, seed=1, donate=False)
    >>> new.packed.shape, new.v.tolist()
    ((3, 6), [25.0, 25.0, 25.0])
  """
  packed, scale, v = _check_state(packed, scale, v)
  x = _common.check_float_array(x, "x", tuple(range(1, 8)))
  grad_out = _common.check_float_array(grad_out, "grad_out", tuple(range(1, 8)))
  out_features, in_features = packed.shape[0], 4 * (packed.shape[1] // 3)
  _check_in_features(x.shape[-1], "x", x)
  if x.shape[-1] != in_features:
    raise ValueError(
        f"x's last dimension must be in_features={in_features} of packed "
        f"{_common.describe(packed)}; got x {_common.describe(x)}")
  if grad_out.shape[-1] != out_features:
    raise ValueError(
        f"grad_out's last dimension must be out_features={out_features} of packed "
        f"{_common.describe(packed)}; got grad_out {_common.describe(grad_out)}")
  if x.shape[:-1] != grad_out.shape[:-1]:
    raise ValueError(
        f"x and grad_out must share their leading (batch) dimensions: x "
        f"{_common.describe(x)}, grad_out {_common.describe(grad_out)}")
  m_rows = math.prod(x.shape[:-1])
  if m_rows == 0:
    raise ValueError(f"x must hold at least one row, got {_common.describe(x)}")
  static = _UpdateStatic(check_C(C), bool(lagged), _common.resolve_implementation(implementation),
                         check_config(config, FromIOConfig))
  check_packed_codes(packed, static.C)
  check_state_values(scale, v)
  hyper = _hyper(lr, lr_scale, rms_beta, rms_eps)
  fn = _from_io_donating if donate else _from_io_copying
  return _run(static.implementation, fn, static, packed, scale, v,
              x.reshape(m_rows, in_features), grad_out.reshape(m_rows, out_features), hyper,
              check_seed(seed))
