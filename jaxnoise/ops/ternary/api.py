"""Public ternary counter ops: validation, implementation switch, donation, custom VJP.

The state of a ternary ``(out, in)`` layer is ``packed`` (``(out, 3 * in // 4)``
uint8, 6-bit counters packed 4 per 3 bytes), ``scale`` (``(out,)`` float32)
and the RMS state ``v`` (``(out,)`` float32); the math is documented in
:mod:`jaxnoise.ops.ternary.reference` (SPEC section 3).

Each op takes ``implementation=``: ``"auto"`` (the Pallas kernel on a GPU, the
reference elsewhere), ``"pallas"`` (GPU only), ``"interpret"`` (the kernel
through the Pallas interpreter; slow, for tests) or ``"reference"``.

The ops live one per module: :mod:`.packing` (pack / unpack / init /
decode), :mod:`.update` (the counter updates, in place by donation),
:mod:`.matmul` (the packed matmul and its VJP); validation is in
:mod:`._validation`, tuning in :mod:`.tuning`. This module holds the layer
state type and re-exports the ops.
"""

from __future__ import annotations

import dataclasses
import functools

import jax

from jaxnoise.ops.ternary._validation import check_C, check_packed_codes, check_seed
from jaxnoise.ops.ternary.matmul import ternary_matmul
from jaxnoise.ops.ternary.packing import pack_codes, ternary_decode, ternary_init, unpack_codes
from jaxnoise.ops.ternary.update import (
    CounterUpdateResult,
    TernaryGrad,
    counter_update,
    counter_update_from_io,
)

__all__ = [
    "CounterUpdateResult",
    "TernaryGrad",
    "TernaryParams",
    "check_C",
    "check_packed_codes",
    "check_seed",
    "counter_update",
    "counter_update_from_io",
    "pack_codes",
    "ternary_decode",
    "ternary_init",
    "ternary_matmul",
    "unpack_codes",
]


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
