"""Public ternary counter ops: validation, implementation switch, donation, custom VJP.

The state of a ternary ``(out, in)`` layer is ``packed`` (``(out, 3 * in // 4)``
uint8, 6-bit counters packed 4 per 3 bytes), ``scale`` (``(out,)`` float32)
and the RMS state ``v`` (``(out,)`` float32); the math is documented in
:mod:`jaxnoise.ops.ternary.reference` (SPEC section 3).

Each op takes ``implementation=``: ``"auto"`` (the Pallas kernel on a GPU, the
reference elsewhere), ``"pallas"`` (GPU only), ``"interpret"`` (the kernel
through the Pallas interpreter; slow, for tests) or ``"reference"``.

In-place updates: :func:`counter_update` and :func:`counter_update_from_io`
*donate* ``packed``, ``scale`` and ``v`` by default (``donate=True``): the
kernels write the new state into the same buffers (``input_output_aliases``),
and the arrays passed in must not be used after the call. Pass
``donate=False`` to keep them (the outputs are then fresh buffers). Inside an
outer ``jax.jit`` donation is decided by that jit's own ``donate_argnums``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxnoise.ops import _common
from jaxnoise.ops import _pallas
from jaxnoise.ops.ternary import reference
from jaxnoise.ops.ternary.config import (
    CounterUpdateConfig,
    ElementwiseConfig,
    FromIOConfig,
    MatmulConfig,
    check_config,
)

__all__ = [
    "CounterUpdateResult",
    "TernaryGrad",
    "TernaryParams",
    "counter_update",
    "counter_update_from_io",
    "pack_codes",
    "ternary_decode",
    "ternary_init",
    "ternary_matmul",
    "unpack_codes",
]

_F32 = jnp.dtype(jnp.float32)
_U8 = jnp.dtype(jnp.uint8)


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


@functools.partial(jax.tree_util.register_dataclass, data_fields=("packed", "scale", "v"),
                   meta_fields=("C",))
@dataclasses.dataclass(frozen=True)
class TernaryParams:
  """The counter state of one ternary ``(out, in)`` layer (a pytree; ``C`` is static).

  Attributes:
    packed: ``(out, 3 * in // 4)`` uint8 packed codes.
    scale: ``(out,)`` float32 row scale.
    v: ``(out,)`` float32 RMS state.
    C: counter half-width in ``1..11`` (pytree metadata, not a leaf).

  Example:
    >>> import jax, jax.numpy as jnp
    >>> packed, scale = ternary_init(jnp.ones((2, 4)), C=3)
    >>> params = TernaryParams(packed, scale, jnp.zeros(2), C=3)
    >>> len(jax.tree.leaves(params)), params.in_features
    (3, 4)
  """

  packed: jax.Array
  scale: jax.Array
  v: jax.Array
  C: int

  @property
  def out_features(self) -> int:
    return self.packed.shape[0]

  @property
  def in_features(self) -> int:
    return 4 * (self.packed.shape[1] // 3)


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


def _kernels(kind: str = ""):
  """A Pallas module, imported lazily (it pulls in the Triton backend).

  ``kind``: ``""`` (pack / unpack / decode / init), ``"update"`` or ``"matmul"``.
  """
  # pylint: disable=g-import-not-at-top
  if kind == "update":
    from jaxnoise.ops.ternary import pallas_triton_update as module
  elif kind == "matmul":
    from jaxnoise.ops.ternary import pallas_triton_matmul as module
  else:
    from jaxnoise.ops.ternary import pallas_triton as module
  return module


def _run(implementation: str, fn, *args, **kwargs):
  """Call ``fn``; around kernel paths, filter the Triton backend's deprecation warning."""
  if implementation == "reference":
    return fn(*args, **kwargs)
  with _pallas.quiet_triton_deprecation():
    return fn(*args, **kwargs)


# ----------------------------------------------------------------------------
# Validation.


def _host_value(value: Any) -> np.ndarray | None:
  """``value`` as a NumPy array, or None when it is traced (known only at run time)."""
  try:
    return np.asarray(value)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
          jax.errors.TracerBoolConversionError):
    return None


def check_C(C: Any) -> int:
  """``C`` is a Python int in ``1..11`` (``3 * (2C - 1)`` codes fit 6 bits)."""
  if isinstance(C, bool):
    raise TypeError(f"C must be an int in {reference.C_MIN}..{reference.C_MAX}, got bool {C!r}")
  try:
    value = operator.index(C)
  except TypeError:
    raise TypeError(
        f"C must be an int in {reference.C_MIN}..{reference.C_MAX} (static), got "
        f"{type(C).__name__} {C!r}") from None
  if not reference.C_MIN <= value <= reference.C_MAX:
    raise ValueError(
        f"C must be in {reference.C_MIN}..{reference.C_MAX} (codes 0..3*(2C-1)-1 must fit "
        f"6 bits), got {value}")
  return value


def _check_in_features(in_features: int, name: str, value: Any) -> None:
  if in_features % 4:
    raise ValueError(
        f"{name}'s in_features={in_features} must be a multiple of 4 (4 codes pack into 3 "
        f"bytes; pad the layer's inputs): {name} {_common.describe(value)}")
  if in_features == 0:
    raise ValueError(f"{name} must have in_features > 0, got {_common.describe(value)}")


def _check_packed(packed: Any, name: str = "packed") -> jax.Array:
  if packed is None or not hasattr(packed, "dtype"):
    raise TypeError(f"{name} must be a uint8 array, got {type(packed).__name__}")
  if jnp.dtype(packed.dtype) != _U8:
    raise TypeError(f"{name} must be uint8 (packed 6-bit codes), got {_common.describe(packed)}")
  if np.ndim(packed) != 2:
    raise ValueError(f"{name} must be 2-D (out, 3 * in // 4), got {_common.describe(packed)}")
  if packed.shape[1] % 3 or packed.shape[1] == 0 or packed.shape[0] == 0:
    raise ValueError(
        f"{name} must have a positive multiple of 3 bytes per row (3 bytes per 4 codes) and "
        f"at least one row, got {_common.describe(packed)}")
  return packed


def _check_row_vector(value: Any, name: str, out_features: int, packed: Any,
                      dtypes=(_F32,)) -> jax.Array:
  value = _common.check_float_array(value, name, (1,), dtypes)
  if value.shape != (out_features,):
    raise ValueError(
        f"{name} must have shape ({out_features},), one entry per row of packed "
        f"{_common.describe(packed)}; got {name} {_common.describe(value)}")
  return value


def _check_state(packed, scale, v):
  packed = _check_packed(packed)
  out_features = packed.shape[0]
  scale = _check_row_vector(scale, "scale", out_features, packed)
  v = _check_row_vector(v, "v", out_features, packed)
  return packed, scale, v


def _check_scalar(value: Any, name: str, *, low: float | None = None, high: float | None = None,
                  low_open: bool = False) -> jax.Array:
  """A finite float scalar (Python number or 0-d array, may be traced)."""
  if isinstance(value, bool):
    raise TypeError(f"{name} must be a float scalar, got bool")
  dtype = getattr(value, "dtype", None)
  if dtype is not None and not (jnp.issubdtype(dtype, jnp.floating)
                                or jnp.issubdtype(dtype, jnp.integer)):
    raise TypeError(f"{name} must be a float scalar, got {_common.describe(value)}")
  if dtype is None and not isinstance(value, (int, float, np.number)):
    raise TypeError(f"{name} must be a float scalar, got {type(value).__name__}")
  if np.ndim(value) != 0:
    raise ValueError(f"{name} must be a scalar, got {_common.describe(value)}")
  host = _host_value(value)
  if host is not None:
    number = float(host)
    bad = not math.isfinite(number)
    if low is not None:
      bad |= number <= low if low_open else number < low
    if high is not None:
      bad |= number > high
    if bad:
      bounds = ""
      if low is not None or high is not None:
        left = "(" if low_open else "["
        bounds = f" in {left}{low if low is not None else '-inf'}, " \
                 f"{high if high is not None else 'inf'}]"
      raise ValueError(f"{name} must be a finite number{bounds}, got {number}")
  return jnp.asarray(value, jnp.float32)


def check_seed(seed: Any, name: str = "seed") -> jax.Array:
  """An integer scalar seed (Python int or integer array; wrapped modulo 2**32) -> ``(1,)`` uint32."""
  if isinstance(seed, bool):
    raise TypeError(f"{name} must be an integer scalar, got bool")
  if isinstance(seed, (int, np.integer)):
    return jnp.asarray([int(seed) & 0xFFFFFFFF], jnp.uint32)
  dtype = getattr(seed, "dtype", None)
  if dtype is None or not jnp.issubdtype(dtype, jnp.integer):
    raise TypeError(
        f"{name} must be an integer scalar (uint32; other ints wrap modulo 2**32), got "
        f"{_common.describe(seed) if dtype is not None else type(seed).__name__}")
  if np.ndim(seed) != 0:
    raise ValueError(f"{name} must be a scalar, got {_common.describe(seed)}")
  return jax.lax.convert_element_type(seed, jnp.uint32).reshape(1)


def _hyper(lr, lr_scale, rms_beta, rms_eps) -> jax.Array:
  return jnp.stack([
      _check_scalar(lr, "lr"),
      _check_scalar(lr_scale, "lr_scale"),
      _check_scalar(rms_beta, "rms_beta", low=0.0, high=1.0),
      _check_scalar(rms_eps, "rms_eps", low=0.0, low_open=True),
  ])


def _check_codes_range(codes: jax.Array, limit: int, name: str, what: str) -> None:
  """Raise on codes outside ``[0, limit)`` when they are concrete."""
  host = _host_value(codes)
  if host is None:
    return
  bad = (host < 0) | (host >= limit)
  if bad.any():
    raise ValueError(
        f"{name} holds {int(bad.sum())} codes outside [0, {limit}) ({what}); min "
        f"{int(host.min())}, max {int(host.max())}; {name} {_common.describe(codes)}")


@functools.partial(jax.jit, static_argnums=1)
def _count_invalid_codes(packed: jax.Array, C: int) -> tuple[jax.Array, jax.Array]:
  codes = reference.unpack_codes_reference(packed)
  return jnp.sum(codes >= reference.n_codes(C), dtype=jnp.int32), jnp.max(codes)


def check_packed_codes(packed: jax.Array, C: int, name: str = "packed") -> None:
  """Every packed code must lie in ``[0, 3 * (2C - 1))``: the one check of every op.

  Concrete ``packed`` raises ``ValueError`` (one on-device reduction and a
  scalar read); traced ``packed`` is checked at run time under
  :func:`jaxnoise.checks.checkify`, and otherwise out-of-range codes saturate
  to ``t = +1`` (an update clips them back into range).
  """
  limit = reference.n_codes(C)
  if _common.is_traced(packed) and not _common.runtime_checks_enabled():
    return
  bad, largest = _count_invalid_codes(packed, C)
  if _common.is_traced(bad):
    _common.runtime_check(bad == 0, f"{name} holds {{}} codes >= {limit} (invalid for C={C})",
                          bad)
    return
  if int(bad):
    raise ValueError(
        f"{name} holds {int(bad)} codes outside [0, {limit}) (invalid for C={C}; max code "
        f"{int(largest)}); {name} {_common.describe(packed)}")


def check_state_values(scale: jax.Array, v: jax.Array) -> None:
  """``scale`` finite and positive, ``v`` finite and non-negative (concrete: ``ValueError``).

  Traced state is checked at run time under :func:`jaxnoise.checks.checkify`;
  otherwise the updates skip rows with an invalid state and count them in
  ``skipped_rows``.
  """
  if (_common.is_traced(scale) or _common.is_traced(v)) and not _common.runtime_checks_enabled():
    return
  for name, value, ok in (("scale", scale, lambda a: (a > 0) & (a < jnp.inf)),
                          ("v", v, lambda a: (a >= 0) & (a < jnp.inf))):
    bad = jnp.sum(~ok(value.astype(jnp.float32)), dtype=jnp.int32)
    what = "finite and positive" if name == "scale" else "finite and non-negative"
    if _common.is_traced(bad):
      _common.runtime_check(bad == 0, f"{name} must be {what}; {{}} rows are not", bad)
    elif int(bad):
      raise ValueError(f"{name} must be {what}; {int(bad)} rows are not ({name} "
                       f"{_common.describe(value)})")


# ----------------------------------------------------------------------------
# Pack / unpack / init / decode.

_pack_reference = jax.jit(reference.pack_codes_reference)
_unpack_reference = jax.jit(reference.unpack_codes_reference)
_init_reference = jax.jit(reference.ternary_init_reference, static_argnums=1)
_decode_reference = jax.jit(reference.ternary_decode_reference, static_argnums=(2, 3))


def pack_codes(codes: jax.Array, *, C: int | None = None, implementation: str = "auto",
               config: ElementwiseConfig | None = None) -> jax.Array:
  """Pack 6-bit codes 4 per 3 bytes: ``(out, in)`` -> ``(out, 3 * in // 4)`` uint8.

  Group ``m`` of a row (codes ``c0..c3`` of columns ``4m..4m+3``) becomes
  bytes ``c0 | c1 << 6``, ``c1 >> 2 | c2 << 4``, ``c2 >> 4 | c3 << 2`` (low 8
  bits each).

  Args:
    codes: ``(out, in)`` integer codes, ``in % 4 == 0``.
    C: if given, codes must lie in ``[0, 3 * (2C - 1))``; otherwise in
      ``[0, 64)``. Checked when ``codes`` is concrete (inside ``jit`` only the
      low 6 bits are kept).
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel tiling (:class:`ElementwiseConfig`) or None (heuristic).

  Returns:
    ``(out, 3 * in // 4)`` uint8.

  Example:
    >>> import jax.numpy as jnp
    >>> packed = pack_codes(jnp.array([[1, 2, 3, 4]], jnp.uint8))
    >>> packed.tolist()
    [[129, 48, 16]]
    >>> unpack_codes(packed).tolist()
    [[1, 2, 3, 4]]
  """
  if isinstance(codes, list):
    codes = np.asarray(codes)
  if not hasattr(codes, "dtype"):
    raise TypeError(f"codes must be an integer array, got {type(codes).__name__}")
  if not jnp.issubdtype(codes.dtype, jnp.integer):
    raise TypeError(f"codes must have an integer dtype (uint8 preferred), got "
                    f"{_common.describe(codes)}")
  if np.ndim(codes) != 2:
    raise ValueError(f"codes must be 2-D (out, in), got {_common.describe(codes)}")
  _check_in_features(codes.shape[1], "codes", codes)
  if codes.shape[0] == 0:
    raise ValueError(f"codes must have at least one row, got {_common.describe(codes)}")
  limit = 64 if C is None else reference.n_codes(check_C(C))
  _check_codes_range(codes, limit, "codes", "6-bit codes" if C is None else f"C={C}")
  config = check_config(config, ElementwiseConfig)
  codes = jnp.asarray(codes)
  implementation = _common.resolve_implementation(implementation)
  if implementation == "reference":
    return _pack_reference(codes)
  return _run(implementation, _pack_jit, codes, config, implementation == "interpret")


@functools.partial(jax.jit, static_argnums=(1, 2))
def _pack_jit(codes, config, interpret):
  return _kernels().pack_codes(codes, config=config, interpret=interpret)


def unpack_codes(packed: jax.Array, *, C: int | None = None, implementation: str = "auto",
                 config: ElementwiseConfig | None = None) -> jax.Array:
  """Unpack ``(out, 3 * in // 4)`` uint8 into ``(out, in)`` uint8 codes.

  Args:
    packed: packed codes (see :func:`pack_codes`).
    C: if given, raise when a code is outside ``[0, 3 * (2C - 1))``
      (concrete ``packed``; see :func:`check_packed_codes`).
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel tiling (:class:`ElementwiseConfig`) or None.

  Returns:
    ``(out, in)`` uint8 codes.

  Example:
    >>> import jax.numpy as jnp
    >>> unpack_codes(jnp.array([[129, 48, 16]], jnp.uint8)).tolist()
    [[1, 2, 3, 4]]
  """
  packed = _check_packed(packed)
  config = check_config(config, ElementwiseConfig)
  if C is not None:
    check_packed_codes(packed, check_C(C))
  implementation = _common.resolve_implementation(implementation)
  if implementation == "reference":
    return _unpack_reference(packed)
  return _run(implementation, _unpack_jit, packed, config, implementation == "interpret")


@functools.partial(jax.jit, static_argnums=(1, 2))
def _unpack_jit(packed, config, interpret):
  return _kernels().unpack_codes(packed, config=config, interpret=interpret)


def ternary_init(weight: jax.Array, C: int, *, implementation: str = "auto",
                 config: ElementwiseConfig | None = None) -> tuple[jax.Array, jax.Array]:
  """Ternary counter state of a float weight (absmean row scale).

  ``scale[row] = mean(|weight[row]|)`` (clipped to ``[1e-5, 10]``) and each
  code is the one whose latent position ``(c + 0.5) / lv - 1.5`` is nearest
  ``weight / scale`` (clipped to ``[-1.5, 1.5]``), so ``t = round(w / scale)``
  clipped to ``[-1, 1]`` as in BitNet b1.58. The RMS state starts at zeros.

  Args:
    weight: ``(out, in)`` float weight (``in % 4 == 0``), ``(out, in)`` layout
      (transpose a Flax ``(in, out)`` kernel first). NaN / inf raise
      ``ValueError`` when concrete; traced, they count as zeros.
    C: counter half-width in ``1..11``.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel tiling (:class:`ElementwiseConfig`) or None.

  Returns:
    ``(packed, scale)``: ``(out, 3 * in // 4)`` uint8 and ``(out,)`` float32.

  Example:
    >>> import jax.numpy as jnp
    >>> packed, scale = ternary_init(jnp.array([[0.5, -1.0, 0.1, 2.4]]), C=2)
    >>> scale.tolist(), ternary_decode(packed, scale, C=2).tolist()
    ([1.0], [[1.0, -1.0, 0.0, 1.0]])
  """
  weight = _common.check_float_array(weight, "weight", (2,))
  _check_in_features(weight.shape[1], "weight", weight)
  if weight.shape[0] == 0:
    raise ValueError(f"weight must have at least one row, got {_common.describe(weight)}")
  C = check_C(C)
  config = check_config(config, ElementwiseConfig)
  _common.check_finite_values(weight, "weight")
  if _common.is_traced(weight):
    # A NaN would become a NaN row scale that every later update keeps.
    weight = jnp.where(jnp.isfinite(weight), weight, jnp.zeros_like(weight))
  implementation = _common.resolve_implementation(implementation)
  if implementation == "reference":
    return _init_reference(weight, C)
  return _run(implementation, _init_jit, weight, C, config, implementation == "interpret")


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _init_jit(weight, C, config, interpret):
  return _kernels().ternary_init(weight, C=C, config=config, interpret=interpret)


def ternary_decode(packed: jax.Array, scale: jax.Array, *, C: int, dtype: Any = jnp.float32,
                   implementation: str = "auto",
                   config: ElementwiseConfig | None = None) -> jax.Array:
  """Dense ``(out, in)`` weights ``scale[row] * t`` of packed codes.

  Codes above the valid range (``>= 3 * (2C - 1)``, only from hand-made
  bytes) raise ``ValueError`` when ``packed`` is concrete; traced, they
  saturate to ``t = +1`` (see :func:`check_packed_codes`).

  Args:
    packed: ``(out, 3 * in // 4)`` uint8.
    scale: ``(out,)`` float scale.
    C: counter half-width in ``1..11``.
    dtype: output float dtype.
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel tiling (:class:`ElementwiseConfig`) or None.

  Returns:
    ``(out, in)`` array of ``dtype``.

  Example:
    >>> import jax.numpy as jnp
    >>> packed = pack_codes(jnp.array([[0, 3, 6, 8]]), C=2)   # lv = 3
    >>> ternary_decode(packed, jnp.array([0.5]), C=2).tolist()
    [[-0.5, 0.0, 0.5, 0.5]]
  """
  packed = _check_packed(packed)
  scale = _check_row_vector(scale, "scale", packed.shape[0], packed, _common.FLOAT_DTYPES)
  C = check_C(C)
  dtype = _common.check_out_dtype(dtype, "dtype")
  config = check_config(config, ElementwiseConfig)
  check_packed_codes(packed, C)
  scale = scale.astype(jnp.float32)
  implementation = _common.resolve_implementation(implementation)
  if implementation == "reference":
    return _decode_reference(packed, scale, C, dtype)
  return _run(implementation, _decode_jit, packed, scale, C, dtype, config,
              implementation == "interpret")


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5))
def _decode_jit(packed, scale, C, dtype, config, interpret):
  return _kernels().ternary_decode(packed, scale, C=C, dtype=dtype, config=config,
                                   interpret=interpret)


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
    packed, scale, v, skipped = _kernels("update").counter_update(
        packed, scale, v, grad_w, hyper, seed, C=static.C, lagged=static.lagged,
        config=static.config, interpret=static.implementation == "interpret")
  return CounterUpdateResult(packed, scale, v, jnp.sum(skipped, dtype=jnp.int32))


def _from_io_impl(static: _UpdateStatic, packed, scale, v, x, grad_out, hyper, seed):
  if static.implementation == "reference":
    packed, scale, v, skipped = reference.counter_update_from_io_reference(
        packed, scale, v, x, grad_out, hyper, seed[0], C=static.C, lagged=static.lagged)
  else:
    packed, scale, v, skipped = _kernels("update").counter_update_from_io(
        packed, scale, v, x, grad_out, hyper, seed, C=static.C, lagged=static.lagged,
        config=static.config, interpret=static.implementation == "interpret")
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
    config: kernel tiling (:class:`CounterUpdateConfig`) or None (heuristic).
    donate: update ``packed``, ``scale`` and ``v`` in place (their buffers are
      reused; do not touch the inputs afterwards).

  Returns:
    :class:`CounterUpdateResult` ``(packed, scale, v, skipped_rows)``.

  Example:
    >>> import jax.numpy as jnp
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
  fused :func:`counter_update`; use it when the ``(out, in)`` float gradient
  does not fit or its traffic matters. ``benchmarks/bench_ternary.py``
  measures both.

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
    config: kernel tiling (:class:`FromIOConfig`) or None (heuristic).
    donate: update ``packed``, ``scale`` and ``v`` in place.

  Returns:
    :class:`CounterUpdateResult` ``(packed, scale, v, skipped_rows)``.

  Example:
    >>> import jax.numpy as jnp
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


# ----------------------------------------------------------------------------
# Packed ternary matmul with a custom VJP.


@dataclasses.dataclass(frozen=True)
class _MatmulStatic:
  C: int
  out_dtype: Any
  implementation: str
  config: Any


def _matmul_forward(static: _MatmulStatic, x, packed, scale, out_dtype=None):
  out_dtype = static.out_dtype if out_dtype is None else out_dtype
  if static.implementation == "reference":
    return reference.ternary_matmul_reference(x, packed, scale, C=static.C, out_dtype=out_dtype)
  return _kernels("matmul").ternary_matmul(x, packed, scale, C=static.C, out_dtype=out_dtype,
                                   config=static.config,
                                   interpret=static.implementation == "interpret")


def _matmul_input_grad(static: _MatmulStatic, grad_y, packed, scale, out_dtype):
  if static.implementation == "reference":
    return reference.ternary_matmul_input_grad_reference(grad_y, packed, scale, C=static.C,
                                                         out_dtype=out_dtype)
  return _kernels("matmul").ternary_matmul_input_grad(grad_y, packed, scale, C=static.C,
                                              out_dtype=out_dtype, config=static.config,
                                              interpret=static.implementation == "interpret")


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _matmul(static, x, packed, scale):
  return _matmul_forward(static, x, packed, scale)


def _matmul_fwd(static, x, packed, scale):
  values = (x.value, packed.value, scale.value)
  perturbed = (x.perturbed, scale.perturbed)
  return _matmul_forward(static, *values), (values, perturbed)


def _matmul_bwd(static, residuals, grad_y):
  (x, packed, scale), (x_perturbed, scale_perturbed) = residuals
  if isinstance(grad_y, jax.custom_derivatives.SymbolicZero):
    grad_y = jnp.zeros(grad_y.shape, grad_y.dtype)
  grad_x = grad_scale = None
  if x_perturbed:
    grad_x = _matmul_input_grad(static, grad_y, packed, scale, x.dtype)
  if scale_perturbed:
    # d y[m, n] / d scale[n] = (x @ t^T)[m, n]: one more packed matmul with unit scale.
    unscaled = _matmul_forward(static, x, packed, jnp.ones_like(scale), out_dtype=jnp.float32)
    grad_scale = jnp.sum(grad_y.astype(jnp.float32) * unscaled, axis=0).astype(scale.dtype)
  return grad_x, None, grad_scale


_matmul.defvjp(_matmul_fwd, _matmul_bwd, symbolic_zeros=True)
_matmul_jit = jax.jit(_matmul, static_argnums=0)


def ternary_matmul(
    x: jax.Array,
    packed: jax.Array,
    scale: jax.Array,
    *,
    C: int,
    out_dtype: Any = None,
    implementation: str = "auto",
    config: MatmulConfig | None = None,
) -> jax.Array:
  """``y = x @ W^T`` with ``W = scale[:, None] * t`` read from the packed codes.

  The kernel loads the 0.75-byte packed codes and decodes them in registers
  (no dense weight is formed); accumulation is float32.

  Differentiation: ``d/dx`` is ``(grad_y * scale) @ t`` (a second packed
  kernel); ``d/dscale`` is exact (``sum_m grad_y * (x @ t^T)``, one more
  packed matmul, computed only when asked for); ``packed`` is integer and has
  no gradient. The weight "gradient" that counter training needs,
  ``grad_y^T x``, is not produced here: capture ``x`` and ``grad_y`` (see
  :func:`jaxnoise.nn.ternary.ternary_value_and_grad`) and hand them to
  :func:`counter_update_from_io`, or form ``grad_y^T x`` densely for
  :func:`counter_update`.

  Args:
    x: ``(..., in)`` float32 / bfloat16 / float16 input.
    packed: ``(out, 3 * in // 4)`` uint8 codes.
    scale: ``(out,)`` float row scale.
    C: counter half-width in ``1..11``.
    out_dtype: output dtype (default ``x.dtype``).
    implementation: ``"auto"``, ``"pallas"``, ``"interpret"``, ``"reference"``.
    config: kernel tiling (:class:`MatmulConfig`) or None (heuristic).

  Returns:
    ``(..., out)`` array of ``out_dtype``.

  Example:
    >>> import jax.numpy as jnp
    >>> packed = pack_codes(jnp.array([[0, 3, 6, 8], [3, 3, 3, 6]]), C=2)
    >>> ternary_matmul(jnp.ones((1, 4)), packed, jnp.array([2.0, 0.5]), C=2).tolist()
    [[2.0, 0.5]]
  """
  packed = _check_packed(packed)
  out_features, in_features = packed.shape[0], 4 * (packed.shape[1] // 3)
  x = _common.check_float_array(x, "x", tuple(range(1, 8)))
  if x.shape[-1] != in_features:
    _check_in_features(x.shape[-1], "x", x)
    raise ValueError(
        f"x's last dimension must be in_features={in_features} of packed "
        f"{_common.describe(packed)}; got x {_common.describe(x)}")
  scale = _check_row_vector(scale, "scale", out_features, packed, _common.FLOAT_DTYPES)
  out_dtype = _common.check_out_dtype(x.dtype if out_dtype is None else out_dtype)
  static = _MatmulStatic(check_C(C), out_dtype, _common.resolve_implementation(implementation),
                         check_config(config, MatmulConfig))
  check_packed_codes(packed, static.C)
  batch_shape = x.shape[:-1]
  m_rows = math.prod(batch_shape)
  if m_rows == 0:
    return jnp.zeros(batch_shape + (out_features,), out_dtype)
  x2 = x.reshape(m_rows, in_features)
  x2, packed, scale = _common.match_varying(x2, packed, scale.astype(jnp.float32))
  y = _run(static.implementation, _matmul_jit, static, x2, packed, scale)
  return y.reshape(batch_shape + (out_features,))
