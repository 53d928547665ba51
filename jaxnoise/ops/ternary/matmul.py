"""The packed ternary matmul ``x @ (scale * t)^T`` with its custom VJP."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

from jaxnoise.ops import _common
from jaxnoise.ops import autotune
from jaxnoise.ops.ternary import config as config_lib
from jaxnoise.ops.ternary import reference
from jaxnoise.ops.ternary._validation import (
    _check_in_features,
    _check_packed,
    _check_row_vector,
    _kernels,
    _run,
    check_C,
    check_packed_codes,
)
from jaxnoise.ops.ternary.config import MatmulConfig, check_config

__all__ = ["ternary_matmul"]


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
  config = static.config
  if config is None:  # A tuned config for this shape, if any (else the kernel's heuristic).
    config = autotune.lookup(*config_lib.matmul_key(
        static.implementation, x.shape[0], packed.shape[0], x.shape[1], x.dtype, out_dtype))
  return _kernels("matmul").ternary_matmul(x, packed, scale, C=static.C, out_dtype=out_dtype,
                                   config=config,
                                   interpret=static.implementation == "interpret")


def matmul_input_grad(grad_y, packed, scale, *, C: int, out_dtype, implementation: str,
                      config=None):
  """The VJP's input gradient ``(grad_y * scale) @ t`` of a 2-D ``grad_y``, by ``implementation``.

  ``config`` None: a config tuned for this shape
  (:func:`jaxnoise.ops.ternary.tuning.tune_matmul_input_grad`), else the
  kernel's heuristic. The forward's config tiles the forward only.
  """
  if implementation == "reference":
    return reference.ternary_matmul_input_grad_reference(grad_y, packed, scale, C=C,
                                                         out_dtype=out_dtype)
  if config is None:
    config = autotune.lookup(*config_lib.matmul_input_grad_key(
        implementation, grad_y.shape[0], 4 * (packed.shape[1] // 3), grad_y.shape[1],
        grad_y.dtype, out_dtype))
  return _kernels("matmul").ternary_matmul_input_grad(grad_y, packed, scale, C=C,
                                              out_dtype=out_dtype, config=config,
                                              interpret=implementation == "interpret")


def _matmul_input_grad(static: _MatmulStatic, grad_y, packed, scale, out_dtype):
  return matmul_input_grad(grad_y, packed, scale, C=static.C, out_dtype=out_dtype,
                           implementation=static.implementation)


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
  (no dense weight is formed); accumulation is float32. From 65 rows (float32
  ``x``: 4) it decodes ``t`` to a temporary for XLA's GEMM instead. On a
  Hopper GPU, 16-bit ``x`` of 16-1024 rows and float32 ``x`` of 4-32 rows
  take a Mosaic GPU kernel whose ``wgmma`` reads ``t`` from registers
  (``MatmulConfig(method="wgmma")``,
  :mod:`jaxnoise.ops.ternary.mosaic_gpu_matmul`). float32 ``x`` keeps every
  product exact, as a float32 matmul does, yet runs on bfloat16 tensor cores
  (:attr:`MatmulConfig.split_float32`; the wgmma kernel takes the same three
  bfloat16 pieces).

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
    config: forward kernel (:class:`MatmulConfig`: tiles, split along ``in``,
      method) or None (a tuned config if :func:`jaxnoise.ops.ternary.tuning.tune_matmul`
      ran for this shape, else the heuristic). The input gradient of the VJP
      takes the config :func:`jaxnoise.ops.ternary.tuning.tune_matmul_input_grad`
      tuned for its shape, else its heuristic.

  Returns:
    ``(..., out)`` array of ``out_dtype``.

  Example:
    >>> import jax.numpy as jnp
    >>> from jaxnoise.ops.ternary import pack_codes
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
