"""The Pallas GPU (Triton) backend: the only module that touches it directly.

* :func:`pallas_call` wraps ``pl.pallas_call`` and silences exactly one
  warning, the Triton backend's deprecation notice (jax >= 0.11), which would
  otherwise fire on every kernel. The notice is emitted when the kernel is
  lowered, which happens lazily at the first call of a jitted function, so
  besides the context manager around ``pallas_call`` a filter for that one
  message (and no other) is installed when this module is imported.
* :func:`compiler_params` builds Triton compiler parameters for both jax
  0.10 and 0.11.
* :func:`fma` is a float32 fused multiply-add (inline PTX when compiled);
  :func:`saturated_add` a float32 add with a constant, clamped to ``[0, 1]``.
* :func:`max_shared_memory_per_block` reads the device's real opt-in
  shared-memory limit from the CUDA driver (``cuDeviceGetAttribute`` with
  attribute 97 through ctypes), never from a table of GPU names;
  :func:`choose_num_stages` turns it into a software-pipelining depth.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from jaxnoise.ops import _common

__all__ = [
    "choose_num_stages",
    "compiler_params",
    "fma",
    "load",
    "max_shared_memory_per_block",
    "pallas_call",
    "quiet_triton_deprecation",
    "saturated_add",
    "store",
]

_TRITON_DEPRECATION = r".*Triton backend is deprecated.*"
warnings.filterwarnings("ignore", message=_TRITON_DEPRECATION)

load = plgpu.load
store = plgpu.store

_CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97


@contextlib.contextmanager
def quiet_triton_deprecation():
  """Silence exactly the Pallas Triton backend's deprecation notice inside the block."""
  with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=_TRITON_DEPRECATION)
    yield


def pallas_call(kernel, *, interpret: bool, **kwargs: Any):
  """``pl.pallas_call`` with the Triton deprecation notice filtered.

  Returns a callable; lowering and the call itself run with the filter on.
  """
  with quiet_triton_deprecation():
    call = pl.pallas_call(kernel, interpret=interpret, **kwargs)

  @functools.wraps(call)
  def wrapped(*args):
    with quiet_triton_deprecation():
      if args and _in_checked_shard_map():
        # shard_map with check_vma=True types every output: it varies where the inputs do.
        args = _common.match_varying(*args)
        out_shape = jax.tree.map(functools.partial(_varying_like, args[0]), kwargs["out_shape"])
        return pl.pallas_call(kernel, interpret=interpret,
                              **dict(kwargs, out_shape=out_shape))(*args)
      return call(*args)

  return wrapped


def _in_checked_shard_map() -> bool:
  """Whether this trace is inside a ``shard_map`` with ``check_vma=True``."""
  try:
    manual_axes = jax.sharding.get_abstract_mesh().manual_axes
  except AttributeError:  # no abstract mesh in this jax
    return False
  return bool(manual_axes) and bool(getattr(jax.config, "check_vma", False))


def _varying_like(example, shape: jax.ShapeDtypeStruct) -> jax.ShapeDtypeStruct:
  """``shape`` with ``example``'s varying manual axes (its shard_map type)."""
  manual = getattr(jax.typeof(example), "manual_axis_type", None)
  if manual is not None:
    return jax.ShapeDtypeStruct(shape.shape, shape.dtype, manual_axis_type=manual)
  return jax.ShapeDtypeStruct(shape.shape, shape.dtype, vma=jax.typeof(example).vma)


def fma(a: jax.Array, b: jax.Array, c: jax.Array, *, compiled: bool) -> jax.Array:
  """float32 ``a * b + c``: compiled, one ``fma.rn.f32`` (one rounding).

  Triton emits ``mul.rn`` and ``add.rn``, which ptxas may not fuse. The
  interpreter takes the multiply and the add (two roundings), so the two can
  differ in the last bit.
  """
  if not compiled:
    return a * b + c
  a, b, c = jnp.broadcast_arrays(*(jnp.asarray(v, jnp.float32) for v in (a, b, c)))
  [out] = plgpu.elementwise_inline_asm(
      "fma.rn.f32 $0, $1, $2, $3;", args=[a, b, c], constraints="=f,f,f,f", pack=1,
      result_shape_dtypes=[jax.ShapeDtypeStruct(a.shape, jnp.float32)])
  return out


def _float32_hex(value: float) -> str:
  """A float32 constant as a PTX immediate (``0f`` and its eight hex digits)."""
  bits = int(np.float32(value).view(np.uint32))
  if float(np.float32(value)) != value:
    raise ValueError(f"{value!r} is not a float32 value")
  return f"0f{bits:08X}"


def saturated_add(a: jax.Array, offset: float, negate: bool, *, compiled: bool) -> jax.Array:
  """float32 ``clip(a + offset, 0, 1)``, or ``clip(offset - a, 0, 1)`` with ``negate``.

  ``offset`` is a float32 constant. Compiled, one ``add.rn.sat.f32`` (or
  ``sub``) with the offset as an immediate, where a ``min`` and a ``max``
  would take two more instructions; interpreted, the add and a clip (the same
  bits).
  """
  if not compiled:
    total = jnp.float32(offset) - a if negate else a + jnp.float32(offset)
    return jnp.clip(total, jnp.float32(0.0), jnp.float32(1.0))
  a = jnp.asarray(a, jnp.float32)
  asm = (f"sub.rn.sat.f32 $0, {_float32_hex(offset)}, $1;" if negate else
         f"add.rn.sat.f32 $0, $1, {_float32_hex(offset)};")
  [out] = plgpu.elementwise_inline_asm(
      asm, args=[a], constraints="=f,f", pack=1,
      result_shape_dtypes=[jax.ShapeDtypeStruct(a.shape, jnp.float32)])
  return out


def compiler_params(num_warps: int, num_stages: int) -> Any:
  """Triton compiler parameters (``plgpu.CompilerParams``)."""
  return plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages)


@functools.cache
def max_shared_memory_per_block() -> int | None:
  """The first GPU's opt-in shared memory per block in bytes, or None.

  Read from the CUDA driver (``cuDeviceGetAttribute(..., 97, dev)`` via
  ``libcuda.so.1``). None when there is no GPU backend or no driver.
  """
  if jax.default_backend() != "gpu":
    return None
  try:
    cuda = ctypes.CDLL("libcuda.so.1")
  except OSError:
    return None
  if cuda.cuInit(0) != 0:
    return None
  device = ctypes.c_int()
  if cuda.cuDeviceGet(ctypes.byref(device), 0) != 0:
    return None
  value = ctypes.c_int()
  status = cuda.cuDeviceGetAttribute(
      ctypes.byref(value), _CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, device)
  return int(value.value) if status == 0 else None


# Used when the limit cannot be read (CPU/interpret, or no driver): the
# smallest opt-in limit of the GPUs Triton supports (sm_75).
_FALLBACK_SHARED_MEMORY = 64 * 1024


def choose_num_stages(per_stage_bytes: int, *, max_stages: int = 4, fixed_bytes: int = 0) -> int:
  """Deepest software pipeline whose shared-memory footprint fits the device.

  Args:
    per_stage_bytes: shared memory one pipeline stage holds (the tiles loaded
      per loop iteration); a pessimistic estimate is safe.
    max_stages: upper bound.
    fixed_bytes: shared memory used outside the pipeline (e.g. operands
      produced in registers and staged once for the matrix units).

  Returns:
    An int in ``[1, max_stages]``.
  """
  limit = max_shared_memory_per_block() or _FALLBACK_SHARED_MEMORY
  stages = (limit - fixed_bytes) // max(1, per_stage_bytes)
  return int(max(1, min(max_stages, stages)))
