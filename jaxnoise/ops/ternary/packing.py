"""Pack / unpack, absmean init and decode of ternary counters (validation, implementation switch)."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxnoise.ops import _common
from jaxnoise.ops.ternary import reference
from jaxnoise.ops.ternary._validation import (
    _check_codes_range,
    _check_in_features,
    _check_packed,
    _check_row_vector,
    _kernels,
    _run,
    check_C,
    check_packed_codes,
)
from jaxnoise.ops.ternary.config import ElementwiseConfig, check_config

__all__ = ["pack_codes", "ternary_decode", "ternary_init", "unpack_codes"]


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
