"""Validation and implementation selection shared by every jaxnoise op."""

from __future__ import annotations

import contextlib
import math
import operator
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

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


# ----------------------------------------------------------------------------
# Run-time checks of traced values (opt-in; see jaxnoise.checks).

_RUNTIME_CHECKS = threading.local()


def runtime_checks_enabled() -> bool:
  """True inside :func:`runtime_checks` (while ``jaxnoise.checks.checkify`` traces)."""
  return getattr(_RUNTIME_CHECKS, "enabled", False)


@contextlib.contextmanager
def runtime_checks(enabled: bool = True):
  """Emit ``checkify`` checks for traced values while tracing inside this context."""
  previous = runtime_checks_enabled()
  _RUNTIME_CHECKS.enabled = bool(enabled)
  try:
    yield
  finally:
    _RUNTIME_CHECKS.enabled = previous


def without_runtime_checks(fn):
  """``fn`` traced with run-time checks off (for bodies of ``custom_vmap`` / ``custom_vjp``)."""

  def wrapped(*args, **kwargs):
    with runtime_checks(False):
      return fn(*args, **kwargs)

  return wrapped


def is_traced(value: Any) -> bool:
  """True for a tracer (a value known only at run time)."""
  return isinstance(value, jax.core.Tracer)


def runtime_check(predicate: Any, message: str, *args: Any) -> None:
  """``checkify.check(predicate, message, *args)`` when run-time checks are on.

  Concrete values are checked eagerly by the callers (a ``ValueError``); this
  covers traced ones, and is a no-op unless :func:`runtime_checks_enabled`.
  """
  if runtime_checks_enabled():
    checkify.check(jnp.asarray(predicate), message, *args)


def check_out_dtype(dtype: Any, name: str = "out_dtype",
                    dtypes: tuple = FLOAT_DTYPES) -> jnp.dtype:
  """A floating output dtype among ``dtypes`` (int / bool dtypes would truncate)."""
  try:
    value = jnp.dtype(dtype)
  except TypeError:
    raise TypeError(f"{name} must be a float dtype, got {dtype!r}") from None
  if value not in dtypes:
    names = ", ".join(str(d) for d in dtypes)
    raise TypeError(f"{name} must be one of ({names}), got {value}")
  return value


def check_finite_values(value: jax.Array, name: str) -> None:
  """Raise when a concrete ``value`` holds NaN or inf; a run-time check when traced."""
  if is_traced(value):
    if not runtime_checks_enabled():
      return
    bad = jnp.sum(~jnp.isfinite(value))
    runtime_check(bad == 0, f"{name} holds {{}} non-finite values (shape "
                  f"{tuple(np.shape(value))})", bad)
    return
  # numpy, not jnp: inside a jit trace jnp would stage the check of a closed-over array.
  bad = int(np.sum(~np.isfinite(np.asarray(value, np.float32))))
  if bad:
    raise ValueError(f"{name} must be finite, got {bad} NaN/inf values in {describe(value)}")


def check_sigma(sigma: Any, name: str = "sigma") -> jax.Array:
  """A positive, finite float scalar (checked when concrete); float32 array out.

  A traced ``sigma`` is checked at run time only under
  :func:`jaxnoise.checks.checkify`; otherwise a NaN gives NaN outputs and a
  negative value mirrors the noise.
  """
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
  sigma = jnp.asarray(sigma, jnp.float32)
  if as_float is None:
    runtime_check(jnp.isfinite(sigma) & (sigma > 0),
                  f"{name} must be positive and finite, got {{}}", sigma)
  return sigma


def check_positive_int(value: Any, name: str) -> int:
  try:
    value = operator.index(value)
  except TypeError:
    raise TypeError(f"{name} must be a Python int, got {type(value).__name__}") from None
  if value <= 0:
    raise ValueError(f"{name} must be positive, got {value}")
  return value


def check_shape(shape: Any, name: str, ndim: int, *, allow_zero: bool = False) -> tuple[int, ...]:
  """A tuple of ``ndim`` positive ints (an int is taken as a 1-tuple); floats and bools raise.

  With ``allow_zero``, zero dims (an empty block) are accepted too.
  """
  if isinstance(shape, (int, np.integer)) and not isinstance(shape, (bool, np.bool_)) \
      and ndim == 1:
    shape = (int(shape),)
  try:
    if any(isinstance(d, (bool, np.bool_)) for d in shape):
      raise TypeError
    shape = tuple(operator.index(d) for d in shape)
  except TypeError:
    raise TypeError(f"{name} must be a tuple of {ndim} ints, got {shape!r}") from None
  low = 0 if allow_zero else 1
  if len(shape) != ndim or any(d < low for d in shape):
    what = "non-negative" if allow_zero else "positive"
    raise ValueError(f"{name} must be {ndim} {what} ints, got {shape}")
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


# ----------------------------------------------------------------------------
# Sums whose order is part of the program, not the compiler's choice.


def pairwise_sum(terms: jax.Array) -> jax.Array:
  """``terms.sum(0)`` by a fixed pairwise tree of elementwise additions.

  Level by level, term ``j`` of the first half is added to term ``j`` of the
  second half (an odd count carries its last term up unchanged). Every output
  element is therefore the same sequence of float32 additions whatever the
  other axes' sizes, the backend or the surrounding program, which XLA's
  ``reduce`` does not promise (its order follows the reduced array's shape).
  :mod:`jaxnoise.parallel` relies on it: a device that forms some rows of a
  gradient gets the bits one device gets for those rows.

  Args:
    terms: ``(n, ...)`` array, ``n >= 1``.

  Returns:
    ``terms.shape[1:]``.

  Example:
    >>> import jax.numpy as jnp
    >>> pairwise_sum(jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])).tolist()
    [9.0, 12.0]
  """
  if terms.shape[0] == 0:
    raise ValueError(f"terms must hold at least one term, got {describe(terms)}")
  while terms.shape[0] > 1:
    half = terms.shape[0] // 2
    paired = terms[:half] + terms[half:2 * half]
    terms = paired if terms.shape[0] % 2 == 0 else jnp.concatenate([paired, terms[2 * half:]])
  return terms[0]


def sealed(x: jax.Array) -> jax.Array:
  """``x + x * 0``: the bits of a finite ``x``, as an addition.

  XLA's CPU backend fuses a product into the addition that consumes it (one
  fused multiply-add, one rounding) in some programs and not in others: it
  removes optimisation barriers before fusing, and whether the two end up in
  one loop depends on the shapes and on everything else the fusion holds.
  A value that ends with this addition cannot be fused that way into its
  consumers (and ``x * 0`` is zero exactly, so whichever product LLVM fuses
  here, the sum is ``x``). Cheap; for small vectors (fitness, scalars) at the
  points where one program's value feeds another part of it.

  Example:
    >>> import jax.numpy as jnp
    >>> sealed(jnp.array([1.5, -0.0])).tolist()
    [1.5, -0.0]
  """
  return x + x * jnp.zeros((), x.dtype)
