"""Validation shared by the ternary ops, the implementation switch and the lazy kernel imports.

Every public ternary op validates its arguments here (shapes, dtypes, ``C``,
hyperparameters, seeds, code ranges) and raises ``ValueError`` / ``TypeError``
naming the argument; nothing below these checks re-validates.
"""

from __future__ import annotations

import functools
import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnoise.ops import _common
from jaxnoise.ops import _pallas
from jaxnoise.ops.ternary import reference

_F32 = jnp.dtype(jnp.float32)
_U8 = jnp.dtype(jnp.uint8)


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
