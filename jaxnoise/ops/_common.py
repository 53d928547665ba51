"""Validation and implementation selection shared by every jaxnoise op."""

from __future__ import annotations

import math
import operator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

IMPLEMENTATIONS = ("auto", "pallas", "interpret", "reference")
FLOAT_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def resolve_implementation(implementation: str) -> str:
  """Map ``"auto"`` to the kernel on a GPU and the reference elsewhere.

  Args:
    implementation: one of ``"auto"``, ``"pallas"`` (compiled Pallas kernel,
      GPU only), ``"interpret"`` (the same kernel through Pallas's
      interpreter, any backend: slow, for tests) or ``"reference"`` (pure JAX).

  Returns:
    ``"pallas"``, ``"interpret"`` or ``"reference"``.
  """
  if implementation not in IMPLEMENTATIONS:
    raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
  if implementation == "auto":
    return "pallas" if jax.default_backend() == "gpu" else "reference"
  if implementation == "pallas" and jax.default_backend() != "gpu":
    raise ValueError(
        'implementation="pallas" compiles a Triton kernel and needs a GPU backend '
        f'(default backend is {jax.default_backend()!r}); use "interpret" to run the '
        'kernel through the Pallas interpreter, or "reference"'
    )
  return implementation


def describe(value: Any) -> str:
  """``shape=(...) dtype=...`` of an array-like, for error messages."""
  return f"shape={tuple(np.shape(value))} dtype={getattr(value, 'dtype', type(value).__name__)}"


def check_float_array(value: Any, name: str, ndims: tuple[int, ...],
                      dtypes: tuple = FLOAT_DTYPES) -> jax.Array:
  """A floating array of one of ``ndims`` ranks and ``dtypes``; raises otherwise."""
  if value is None:
    raise TypeError(f"{name} must be an array, got None")
  dtype = getattr(value, "dtype", None)
  if dtype is None:
    value = jnp.asarray(value, jnp.float32)
    dtype = value.dtype
  if np.dtype(dtype) == np.float64 and not jax.config.jax_enable_x64:
    # What jnp.asarray does with float64 data when x64 is off: float32.
    value = jnp.asarray(value, jnp.float32)
    dtype = value.dtype
  if jnp.dtype(dtype) not in dtypes:
    names = ", ".join(str(d) for d in dtypes)
    raise TypeError(f"{name} must have dtype in ({names}), got {describe(value)}")
  if np.ndim(value) not in ndims:
    ranks = " or ".join(f"{d}-D" for d in ndims)
    raise ValueError(f"{name} must be {ranks}, got {describe(value)}")
  return value


def concrete_float(value: Any) -> float | None:
  """``float(value)``, or None when ``value`` is traced (not known until run time)."""
  try:
    return float(value)
  except (jax.errors.ConcretizationTypeError, jax.errors.TracerArrayConversionError,
          jax.errors.TracerBoolConversionError):
    return None


def check_sigma(sigma: Any, name: str = "sigma") -> jax.Array:
  """A positive, finite float scalar (checked when concrete); float32 array out."""
  dtype = getattr(sigma, "dtype", None)
  if dtype is not None and not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f"{name} must be a float scalar, got {describe(sigma)}")
  if isinstance(sigma, bool):
    raise TypeError(f"{name} must be a float scalar, got bool")
  if np.ndim(sigma) != 0:
    raise ValueError(f"{name} must be a scalar, got {describe(sigma)}")
  as_float = concrete_float(sigma)
  if as_float is not None:
    if not math.isfinite(as_float) or as_float <= 0:
      raise ValueError(f"{name} must be positive and finite, got {as_float}")
  return jnp.asarray(sigma, jnp.float32)


def check_positive_int(value: Any, name: str) -> int:
  try:
    value = operator.index(value)
  except TypeError:
    raise TypeError(f"{name} must be a Python int, got {type(value).__name__}") from None
  if value <= 0:
    raise ValueError(f"{name} must be positive, got {value}")
  return value


def check_shape(shape: Any, name: str, ndim: int) -> tuple[int, ...]:
  """A tuple of ``ndim`` positive ints (an int is taken as a 1-tuple)."""
  if isinstance(shape, (int, np.integer)) and ndim == 1:
    shape = (int(shape),)
  try:
    shape = tuple(operator.index(d) for d in shape)
  except TypeError:
    raise TypeError(f"{name} must be a tuple of {ndim} ints, got {shape!r}") from None
  if len(shape) != ndim or any(d <= 0 for d in shape):
    raise ValueError(f"{name} must be {ndim} positive ints, got {shape}")
  return shape


# ----------------------------------------------------------------------------
# Varying manual axes (``jax.shard_map`` with ``check_vma=True``).
#
# Inside ``shard_map`` an array's type records the mesh axes along which it
# varies. The ops read only these types, never a mesh: an op whose inputs
# vary along different axes first casts every input to the union (a no-op
# on the data, what JAX's own primitives do implicitly), so a custom VJP's
# cotangents and a Pallas kernel's outputs have the types JAX expects.


def varying_axes(*values: Any) -> frozenset:
  """The union of the varying manual axes of ``values`` (None entries skipped).

  Empty outside ``shard_map`` and under ``check_vma=False``.
  """
  axes = frozenset()
  for value in values:
    if value is None:
      continue
    aval = jax.typeof(value)
    manual = getattr(aval, "manual_axis_type", None)
    if manual is not None:
      axes |= frozenset(manual.varying)
    else:
      axes |= frozenset(getattr(aval, "vma", ()))
  return axes


def match_varying(*values: Any) -> tuple[Any, ...]:
  """``values`` cast to vary along the union of their varying axes (None kept).

  Example:
    >>> import jax.numpy as jnp
    >>> a, b = match_varying(jnp.ones(2), None)  # outside shard_map: unchanged
    >>> b is None
    True
  """
  axes = varying_axes(*values)
  if not axes:
    return values
  cast = []
  for value in values:
    missing = axes - varying_axes(value) if value is not None else frozenset()
    if missing:
      value = _pcast_varying(value, tuple(sorted(missing)))
    cast.append(value)
  return tuple(cast)


def _pcast_varying(value, axes: tuple[str, ...]):
  pcast = getattr(jax.lax, "pcast", None)
  if pcast is not None:
    return pcast(value, axes, to="varying")
  return jax.lax.pvary(value, axes)  # jax < 0.8
