"""The Pallas Mosaic GPU backend (Hopper): the only module that touches it directly.

Mosaic GPU kernels use the Hopper-only matrix instructions (``wgmma``) and
the tensor memory accelerator that the Triton backend reaches only through
its own compiler's choices, so a GEMM written for it runs at XLA's speed and
can take work into its epilogue (:mod:`jaxnoise.ops.virtual_noise.mosaic_gpu_low_rank`).

* :func:`is_hopper` says whether the default device runs these kernels
  (compute capability 9.x; other GPUs and the CPU take the Triton kernels).
* :func:`kernel` wraps ``plgpu.kernel`` for jax 0.10 and 0.11 and types its
  output inside ``shard_map`` as :func:`jaxnoise.ops._pallas.pallas_call`
  does.
* :func:`load_rows` / :func:`load_columns` load a vector in the layout of a
  ``wgmma`` accumulator's rows or columns.

Pallas has no interpreter for these kernels' collective allocations, so they
run on a Hopper GPU only; CI lowers them for CUDA on the CPU
(``jax.jit(...).trace(...).lower(lowering_platforms=("cuda",))``), which runs
the whole Pallas-to-Mosaic translation and its shared-memory check.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import jax
from jax.experimental.pallas import mosaic_gpu as plgpu

from jaxnoise.ops import _common
from jaxnoise.ops import _pallas

__all__ = ["SHARED_MEMORY_BYTES", "is_hopper", "kernel", "load_columns", "load_rows"]

# Opt-in shared memory per block of a Hopper GPU (H100 and H200): 227 KiB.
SHARED_MEMORY_BYTES = 232448


@functools.cache
def is_hopper() -> bool:
  """Whether the default JAX device is a Hopper GPU (compute capability 9.x)."""
  if jax.default_backend() != "gpu":
    return False
  capability = str(getattr(jax.devices()[0], "compute_capability", ""))
  return capability.split(".")[0] == "9"


def kernel(body, *, out_type: jax.ShapeDtypeStruct, **kwargs: Any):
  """``plgpu.kernel(body, out_type=..., **kwargs)``, typed for a checked ``shard_map``."""

  def call(*args):
    out = out_type
    if args and _pallas._in_checked_shard_map():  # pylint: disable=protected-access
      args = _common.match_varying(*args)
      out = _pallas._varying_like(args[0], out_type)  # pylint: disable=protected-access
    return plgpu.kernel(body, out_type=out, **kwargs)(*args)

  return call


# jax 0.10 takes the index as a required argument of plgpu.load; jax 0.11
# deprecates passing it (the reference is indexed with ``.at`` first).
_LOAD_NEEDS_INDEX = (inspect.signature(plgpu.load).parameters["idx"].default
                     is inspect.Parameter.empty)


def _load(ref, layout) -> jax.Array:
  if _LOAD_NEEDS_INDEX:
    return plgpu.load(ref, (), layout=layout, optimized=False)
  return plgpu.load(ref, layout=layout, optimized=False)


def load_rows(ref) -> jax.Array:
  """A ``(rows,)`` vector from ``ref`` in the layout of a wgmma accumulator's rows."""
  return _load(ref, plgpu.Layout.WGMMA.reduce(1))


def load_columns(ref) -> jax.Array:
  """A ``(cols,)`` vector from ``ref`` in the layout of a wgmma accumulator's columns."""
  return _load(ref, plgpu.Layout.WGMMA.reduce(0))

