"""Opt-in run-time checks of traced values, through ``jax.experimental.checkify``.

jaxnoise validates every *concrete* argument when it is called: a bad value
raises ``ValueError`` / ``TypeError`` naming the argument. Values that are
*traced* (inside ``jit``, ``vmap``, ``grad``, ``scan``) are not known then,
and by default the ops follow a documented policy instead of checking them:

* a NaN ``sigma`` gives NaN outputs and a negative one mirrors the noise;
* a NaN or inf fitness in the raw gradient ops makes the gradient NaN (the
  ES transform, which owns its state, repairs fitness first);
* packed codes outside ``C``'s range saturate to ``t = +1`` (updates clip
  them back), and counter updates skip rows whose ``scale`` or ``v`` is
  invalid and count them in ``skipped_rows``;
* non-finite weights given to ``ternary_init`` count as zeros.

:func:`checkify` turns those into run-time errors: it traces the function
with jaxnoise's checks switched on and returns ``(error, out)`` like
``jax.experimental.checkify.checkify`` (``error.throw()`` raises).

Example:
  >>> import jax, jax.numpy as jnp, jaxnoise
  >>> from jaxnoise import checks
  >>> def layer(sigma):
  ...   return jaxnoise.virtual_perturbed_linear(jnp.ones((2, 4)), jnp.ones((3, 4)), None,
  ...                                            jnp.arange(2), sigma)
  >>> error, _ = jax.jit(checks.checkify(layer))(jnp.float32(-1.0))
  >>> print(error.get())  # doctest: +ELLIPSIS
  sigma must be positive and finite, got -1.0 (`check` failed)...
  >>> error, _ = jax.jit(checks.checkify(layer))(jnp.float32(0.1))
  >>> error.get() is None
  True

A function that was already traced (and cached by ``jax.jit``) outside
:func:`checkify` keeps its trace: wrap the outermost function, as above.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from jax.experimental import checkify as _checkify

from jaxnoise.ops import _common

__all__ = ["checkify", "enabled"]

enabled = _common.runtime_checks
"""Context manager: trace with jaxnoise's run-time checks (for use under your own checkify)."""


def checkify(fn: Callable[..., Any], errors: Any = _checkify.user_checks) -> Callable[..., Any]:
  """``jax.experimental.checkify.checkify(fn)`` with jaxnoise's run-time checks on.

  Args:
    fn: the function to check (it may call any jaxnoise op, under ``jit``,
      ``vmap`` or ``grad``).
    errors: the checkify error set (default: user checks, which are the ones
      jaxnoise adds; e.g. ``checkify.user_checks | checkify.nan_checks``).

  Returns:
    A function with ``fn``'s arguments that returns ``(error, out)``.
  """
  checked = _checkify.checkify(fn, errors=errors)

  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    with _common.runtime_checks():
      return checked(*args, **kwargs)

  return wrapper
